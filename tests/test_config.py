import dataclasses
import json

import pytest

from bsi.config import (
    DEFAULT_RATIOS,
    PRESETS,
    SWEEP_PRESETS,
    CompressConfig,
    HutchinsonConfig,
    PipelineConfig,
    SizeRule,
    flat_fields,
    flat_value,
    implied_updates,
    make_config,
)
from bsi.errors import BSIError


def test_schedule_derivations_match_the_paper():
    c = CompressConfig(size=SizeRule.keep(0.3), rounds=10, iters_per_epoch=500, pruning_epochs=2.0, sampling_ratio=0.1)
    assert c.total_iters == 1000
    assert c.round_length == 100  # IterPerPruning
    assert c.profiling_iters == 10  # NumProfilingIter
    assert c.keep_per_round == pytest.approx(0.3 ** 0.1)
    assert c.pool_rho == pytest.approx(0.3 ** 0.1)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"keep_ratio": 0.0}, "keep_ratio"),
        ({"keep_ratio": 1.5}, "keep_ratio"),
        ({"eps": 0.0}, "eps"),
        ({"eps": 1.0}, "eps"),
        ({"rounds": 0}, "rounds"),
        ({"score": "l1"}, "score"),
        ({"probe_scope": "row"}, "probe_scope"),
        ({"size_mode": "both"}, "size_mode"),
        ({"target_ratio": None}, "target_ratio"),
        ({"size_mode": "keep", "target_ratio": 2.0}, "target_ratio"),  # the unread ratio is checked too
        ({"stops": [0.5], "target_ratio": 0.6}, "every stop must lie in"),
        ({"stops": [0.8], "size_mode": "keep"}, "stops need size mode target"),
        ({"stops": ["0.8"]}, "stops must be a list of numbers"),
        ({"size_ratio": 0.5}, "unknown CompressConfig key"),
        ({"curvature": "exact"}, "curvature"),
        ({"bases": "qr"}, "bases"),
        ({"score": "basel", "selection": "global"}, "selection global"),
        ({"gamma": 0}, "gamma"),
        ({"iters_per_epoch": 3, "rounds": 4}, "at least 2"),
    ],
)
def test_bad_compress_values_raise_one_line(kwargs, match):
    with pytest.raises(BSIError, match=match) as err:
        CompressConfig.from_dict(kwargs)  # as a JSON file or the flags give them: the hutchinson settings flat
    assert "\n" not in str(err.value)


def test_the_hutchinson_settings_are_nested_in_python_and_flat_in_files():
    """``CompressConfig.hutchinson`` holds what only that curvature source reads; every file and flag keeps it flat."""
    config = CompressConfig(curvature="hutchinson", hutchinson=HutchinsonConfig(probe_scope="model", eps=0.05))
    written = config.to_dict()
    assert "hutchinson" not in written and written["probe_scope"] == "model" and written["eps"] == 0.05
    assert list(written) == [f.name for f in flat_fields(CompressConfig)]  # each key where the flat class had it
    assert CompressConfig.from_dict(written) == config
    nested = {k: v for k, v in written.items() if k not in ("probe_scope", "eps")} | {
        "hutchinson": {"probe_scope": "model", "eps": 0.05}}
    assert CompressConfig.from_dict(nested) == config  # a nested section reads too
    assert CompressConfig.from_dict(nested | {"eps": 0.02}).hutchinson.eps == 0.02  # a flat key over the section
    assert PipelineConfig.from_dict(make_config("default").to_dict()).compress.hutchinson == HutchinsonConfig()
    overrides = {"compress": {"probe_scope": "model", "eps_floor": 0.0}}  # flags and protocols: flat keys
    assert make_config("smoke", overrides).compress.hutchinson == HutchinsonConfig(probe_scope="model", eps_floor=0.0)
    with pytest.raises(BSIError, match="hutchinson must be a JSON object"):
        CompressConfig.from_dict({"hutchinson": "model"})
    with pytest.raises(BSIError, match="unknown HutchinsonConfig key"):
        CompressConfig.from_dict({"hutchinson": {"probes": 3}})
    assert flat_value(config, "eps") == 0.05 and flat_value(config, "rounds") == config.rounds
    with pytest.raises(KeyError):
        flat_value(config, "hutchinson.eps")


def test_the_size_rule_is_one_choice_in_python_and_the_same_keys_in_files():
    """``CompressConfig.size`` holds one rule and one ratio; files keep the keys they always had."""
    assert CompressConfig().size == SizeRule.target(DEFAULT_RATIOS["target"])
    keep = CompressConfig(size=SizeRule.keep(0.3))
    written = keep.to_dict()
    assert (written["size_mode"], written["keep_ratio"], written["stops"]) == ("keep", 0.3, ())
    assert written["target_ratio"] == DEFAULT_RATIOS["target"]  # the other mode's ratio: its default, not read
    assert list(written) == [f.name for f in flat_fields(CompressConfig)]  # each key where the flat class had it
    assert CompressConfig.from_dict(written) == keep and keep.pool_rho == pytest.approx(0.3 ** (1 / keep.rounds))
    assert CompressConfig.from_dict(written | {"target_ratio": 0.9}) == keep  # a file's unread ratio changes nothing
    path = SizeRule.target(0.25, stops=[0.4, 0.6, 0.4])
    assert path.stops == (0.6, 0.4) and path.sizes == (0.6, 0.4, 0.25) and SizeRule.keep(0.5).sizes == (0.5,)
    assert CompressConfig.from_dict({"stops": [0.6], "target_ratio": 0.3}).size == SizeRule.target(0.3, stops=(0.6,))
    assert flat_value(keep, "keep_ratio") == 0.3 and flat_value(keep, "size_mode") == "keep"
    with pytest.raises(BSIError, match=r"keep_ratio must be in \(0, 1\], got 0"):
        SizeRule.keep(0)
    with pytest.raises(BSIError, match="size_mode must be one of target, keep"):
        SizeRule("both", 0.5)
    with pytest.raises(BSIError, match="size must be a SizeRule"):
        CompressConfig(size=0.5)


def test_json_round_trip_and_unknown_keys(tmp_path):
    config = make_config("default", {"compress": {"target_ratio": 0.4}})
    assert config.compress.size == SizeRule.target(0.4)
    keep = make_config("default", {"compress": {"keep_ratio": 0.4}})  # a KeepRatio implies the mass rule
    assert keep.compress.size == SizeRule.keep(0.4)
    assert make_config("paper-scale", {"compress": {"target_ratio": 0.5}}).compress.size == SizeRule.target(0.5)
    assert make_config("paper-scale", {"compress": {"size_mode": "target"}}).compress.size == SizeRule.target(0.43)
    explicit = make_config("default", {"compress": {"keep_ratio": 0.4, "size_mode": "target"}})
    assert explicit.compress.size == SizeRule.target(0.43)  # an explicit mode wins over the implied one
    path = tmp_path / "c.json"
    path.write_text(config.to_json())
    assert PipelineConfig.from_json(path) == config
    data = json.loads(config.to_json())
    data["compress"]["keep_ration"] = 0.3
    with pytest.raises(BSIError, match="keep_ration"):
        PipelineConfig.from_dict(data)


def _flat(values: dict, prefix: str = "") -> dict:
    """``{"compress": {"rounds": 4}}`` -> ``{"compress.rounds": 4}``."""
    out = {}
    for key, value in values.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return out


def test_every_preset_sets_what_it_names_and_keeps_the_defaults_elsewhere():
    defaults = _flat(PipelineConfig().to_dict())
    jobs = {}
    for name, values in PRESETS.items():
        got = _flat(make_config(name).to_dict())
        named = _flat(implied_updates(values))
        assert {k: got[k] for k in named} == {k: (list(v) if isinstance(v, tuple) else v) for k, v in named.items()}
        assert {k: v for k, v in got.items() if k not in named and k != "preset"} == \
            {k: v for k, v in defaults.items() if k not in named and k != "preset"}
        jobs[name] = tuple(sorted((k, str(v)) for k, v in got.items() if k != "preset"))
    assert len(set(jobs.values())) == len(jobs), "two presets run the same job"
    with pytest.raises(BSIError, match="unknown preset"):
        make_config("fast")


def test_the_python_api_defaults_are_the_default_preset():
    """``PipelineConfig()`` runs the same job as ``bsi compress`` (whose preset is ``default``)."""
    assert make_config("default") == dataclasses.replace(PipelineConfig(), preset="default")
    assert make_config(None) == PipelineConfig()


def test_the_embedded_cpu_presets_share_the_default_fine_tune():
    """quality and sweep-cpu start from the default preset's fine-tuned model: one cache entry serves all three."""
    import torch

    from bsi.pipeline.runner import finetune_cache_key

    key = finetune_cache_key(make_config("default"), torch.float32)
    for name in ("quality", "sweep-cpu"):
        assert finetune_cache_key(make_config(name), torch.float32) == key, name


# ---------------------------------------------------------------- the defaults, the protocol, the registry
def test_the_default_configuration_is_the_tuned_protocol_plus_the_default_preset():
    from bsi.config import PROTOCOLS, TUNED_FIELDS, protocol_deviations

    default = make_config("default")
    assert make_config("default", {"protocol": "tuned"}).to_dict() == default.to_dict()
    assert default.to_dict() == dataclasses.replace(PipelineConfig(), preset="default").to_dict()
    assert default.protocol == "tuned" and protocol_deviations(default) == []
    assert set(PROTOCOLS["tuned"]["compress"]) == set(TUNED_FIELDS)
    # the published protocol differs from the defaults in every setting the tuned one fixes
    defaults = CompressConfig().to_dict()  # the file's flat keys: eps_floor is the hutchinson section's
    assert all(PROTOCOLS["paper"]["compress"][name] != defaults[name] for name in TUNED_FIELDS)


def test_each_one_change_protocol_differs_from_the_published_one_in_exactly_the_setting_it_names():
    from bsi.config import PROTOCOLS, protocol_deviations

    changed = {"paper-whitened": {"bases": "whitened"}, "paper-layer-probes": {"probe_scope": "layer"}}
    for name, change in changed.items():
        paper, this = PROTOCOLS["paper"]["compress"], PROTOCOLS[name]["compress"]
        assert {k: v for k, v in this.items() if paper[k] != v} == change, name
        config = make_config("tour", {"protocol": name})
        assert protocol_deviations(config) == [] and config.compress.to_dict()[next(iter(change))] == \
            next(iter(change.values()))
        # run under `paper` with the one flag, the same settings are a deviation of `paper`, named as such
        as_flag = make_config("tour", {"protocol": "paper", "compress": change})
        assert protocol_deviations(as_flag) == [f"{k}={v}" for k, v in change.items()]
    assert SWEEP_PRESETS["study"]["protocol_targets"]["paper-whitened"] == \
        SWEEP_PRESETS["study"]["protocol_targets"]["paper"]


def test_round_lines_are_read_back_from_a_log_even_when_the_path_stopped_midway():
    from bsi.shipped import round_losses

    log = ("finetune: step 1/50, finetune loss 1.0566\n"
           "round 1/40: compressible layers at 100.0% (106,168,320 params), 92,914 bases kept, mean tuning loss "
           "0.0354, eps 0.000491\ncompress: step 48/480 (10%), profile loss 4.1959\n"
           "round 2/40: compressible layers at 100.0% (106,168,320 params), 88,177 bases kept, mean tuning loss "
           "0.3861, eps 0.000491\nbsi sweep: interrupted\n")
    assert round_losses(log) == [(1, 40, 92914, 0.0354), (2, 40, 88177, 0.3861)]
    assert round_losses("no rounds here") == []


def test_every_method_is_named_once_and_its_kind_is_answered_one_way():
    from bsi.config import ENGINE_METHODS, METHOD_NAMES, METHOD_SPECS, VARIANT_NAMES, is_engine_method

    assert set(METHOD_NAMES) | set(VARIANT_NAMES) == set(METHOD_SPECS) and not set(METHOD_NAMES) & set(VARIANT_NAMES)
    assert ENGINE_METHODS == ("basel", "bsi-grad", "bsi", "bsi-mag", "bsi-curvature", "bsi-grad-tested")
    assert [is_engine_method(n) for n in ("svd", "asvd", "basel", "bsi-mag", "no-such")] == [False, False, True, True,
                                                                                            False]
    assert METHOD_SPECS["bsi-mag"].compress_settings == {"score": "bsi", "within_layer": "magnitude"}
    assert METHOD_SPECS["svd-llm"].compress_settings == {}


def test_one_resolver_layers_preset_protocol_flags_method_and_sizes_in_that_order():
    from bsi.config import PROTOCOLS, resolve_config

    config = resolve_config("tour", {"compress": {"rounds": 2, "within_layer": "score"}}, method="bsi-mag",
                            protocol="paper", protocol_settings={"compress": {"rounds": 3, "gamma": 2.0}},
                            sizes=(0.25, 0.6, 0.4))
    assert config.preset == "tour" and config.recover.steps == PRESETS["tour"]["recover"]["steps"]  # 1. the preset
    assert config.protocol == "paper" and config.compress.bases == PROTOCOLS["paper"]["compress"]["bases"]  # 2.
    assert config.compress.gamma == 2.0  # 3. the protocol's own settings
    assert config.compress.rounds == 2  # 4. the flags win over both
    assert (config.compress.score, config.compress.within_layer) == ("bsi", "magnitude")  # 5. the method's own
    assert config.compress.size == SizeRule.target(0.25, stops=(0.6, 0.4))  # 6. the sizes
    assert resolve_config("tour").to_dict() == make_config("tour").to_dict()
    with pytest.raises(BSIError, match="unknown method 'nope': use one of svd, "):
        resolve_config(method="nope")


def test_the_configuration_package_imports_no_torch_and_exports_what_it_lists():
    """``bsi --help`` stays fast: the package loads without torch; every name of ``__all__`` is importable from it."""
    import subprocess
    import sys

    code = ("import sys, bsi.config as c; assert 'torch' not in sys.modules, 'bsi.config imported torch'; "
            "missing = [n for n in c.__all__ if not hasattr(c, n)]; assert not missing, missing")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_measured_costs_are_read_from_their_data_file():
    """``preset_costs.json`` is the one place a measured time is written: the constant is what the file says."""
    import importlib.resources

    from bsi.config.presets import PRESET_COSTS, read_preset_costs

    data = json.loads(importlib.resources.files("bsi.config").joinpath("preset_costs.json").read_text(encoding="utf-8"))
    assert read_preset_costs() == PRESET_COSTS
    assert {name: dataclasses.asdict(cost) for name, cost in PRESET_COSTS.items()} == data["presets"]


def test_a_baseline_setting_is_read_and_refused_like_every_other_setting():
    from bsi.config import BaselineConfig

    settings = BaselineConfig.from_dict({"alpha": 1.0, "allocation": "uniform"})
    assert settings.to_dict()["alpha"] == 1.0 and BaselineConfig.from_dict(settings.to_dict()) == settings
    with pytest.raises(BSIError, match="unknown BaselineConfig key"):
        BaselineConfig.from_dict({"alfa": 1.0})
    with pytest.raises(BSIError, match="allocation must be one of"):
        BaselineConfig.from_dict({"allocation": "even"})
