import json

import pytest

from bsi.config import PRESETS, CompressConfig, PipelineConfig, make_config
from bsi.errors import BSIError


def test_schedule_derivations_match_the_paper():
    c = CompressConfig(size_mode="keep", keep_ratio=0.3, rounds=10, iters_per_epoch=500, pruning_epochs=2.0, sampling_ratio=0.1)
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
        ({"curvature": "exact"}, "curvature"),
        ({"bases": "qr"}, "bases"),
        ({"score": "basel", "selection": "global"}, "selection global"),
        ({"gamma": 0}, "gamma"),
        ({"iters_per_epoch": 3, "rounds": 4}, "at least 2"),
    ],
)
def test_bad_compress_values_raise_one_line(kwargs, match):
    with pytest.raises(BSIError, match=match) as err:
        CompressConfig(**kwargs)
    assert "\n" not in str(err.value)


def test_json_round_trip_and_unknown_keys(tmp_path):
    config = make_config("default", {"compress": {"target_ratio": 0.4}})
    assert config.compress.size_mode == "target" and config.compress.target_ratio == 0.4
    keep = make_config("default", {"compress": {"keep_ratio": 0.4}})  # a KeepRatio implies the mass rule
    assert keep.compress.size_mode == "keep" and keep.compress.ratio == 0.4
    explicit = make_config("default", {"compress": {"keep_ratio": 0.4, "size_mode": "target"}})
    assert explicit.compress.size_mode == "target"  # an explicit mode wins over the implied one
    path = tmp_path / "c.json"
    path.write_text(config.to_json())
    assert PipelineConfig.from_json(path) == config
    data = json.loads(config.to_json())
    data["compress"]["keep_ration"] = 0.3
    with pytest.raises(BSIError, match="keep_ration"):
        PipelineConfig.from_dict(data)


def test_every_preset_is_valid():
    for name in PRESETS:
        assert make_config(name).preset == name
    with pytest.raises(BSIError, match="unknown preset"):
        make_config("fast")
