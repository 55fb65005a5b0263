"""bsi.teaching: the notebooks' views of the library, checked against independent computations."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from bsi.config import PRESETS, PROTOCOLS, SIZE_MODES, CompressConfig, SizeRule, make_config
from bsi.errors import BSIError
from bsi.method.bases import svd_bases, whitened_bases
from bsi.method.curvature import Fisher, GradientOnly, Hutchinson, exact_hessian, sigma_gradients
from bsi.method.engine import Compressor
from bsi.method.layers import BasisLinear
from bsi.method.scores import probe_vector
from bsi.method.surgery import basis_layers, compressible_linear_names, to_basis_form, to_exported_form
from bsi.models import EMBEDDED_MODEL, TINY_MODEL
from bsi.teaching import (
    FURTHER_READING,
    METHOD_SECTIONS,
    NOTEBOOK_MODEL_ENV,
    block_index,
    defaults_rows,
    defaults_table_markdown,
    doc_markdown,
    loss_change_when_dropped,
    notebook_settings,
    profile_rows,
    rank_history,
    rank_table,
    result_of,
    truncation_errors,
)
from tests.conftest import lm_loss, make_tiny_llama, token_batches
from tests.test_readme import heading_anchors

LAYER = "model.layers.1.mlp.down_proj"
ROOT = Path(__file__).resolve().parents[1]


def _batch(seed: int = 1) -> dict:
    return next(token_batches(batch=2, length=12, seed=seed))


def _one_layer(model=None) -> tuple:
    model = make_tiny_llama() if model is None else model
    return model, to_basis_form(model, aux_rank=0, names=[LAYER])[LAYER]


def test_settings_follow_the_environment_variable():
    assert notebook_settings({}).model == EMBEDDED_MODEL and not notebook_settings({}).quick
    assert notebook_settings({NOTEBOOK_MODEL_ENV: "embedded"}).model == EMBEDDED_MODEL
    tiny = notebook_settings({NOTEBOOK_MODEL_ENV: TINY_MODEL})
    assert tiny.model == TINY_MODEL and tiny.quick and tiny.spectrum_k < notebook_settings({}).spectrum_k
    other = notebook_settings({NOTEBOOK_MODEL_ENV: "/some/folder"})
    assert other.model == "/some/folder" and other.spectrum_k == notebook_settings({}).spectrum_k
    assert other.pipeline_config().model == other.sweep_config().model == "/some/folder"
    assert tiny.pipeline_config().model == TINY_MODEL and tiny.pipeline_config().preset == tiny.preset


@pytest.mark.parametrize("which", ["pipeline", "sweep"])
@pytest.mark.parametrize("env", [{}, {NOTEBOOK_MODEL_ENV: TINY_MODEL}])
def test_pipeline_runs_cut_only_the_work_of_their_preset(env, which):
    settings = notebook_settings(env)
    preset, work = (settings.preset, settings.work) if which == "pipeline" else (settings.sweep_preset,
                                                                                 settings.sweep_work)
    config = settings.pipeline_config() if which == "pipeline" else settings.sweep_config()
    reference = make_config(preset)
    assert config.preset == preset and config.model == settings.model
    for section in ("finetune", "compress", "recover"):  # every setting the work does not name is the preset's
        for f in dataclasses.fields(getattr(config, section)):
            if f.name not in work.get(section, {}):
                assert getattr(getattr(config, section), f.name) == getattr(getattr(reference, section), f.name)
    assert config.compress.size.mode == "target" == reference.compress.size.mode
    assert set(work) <= {"eval_examples", "finetune", "compress", "recover"}  # amounts of work, not the method
    assert set(work.get("finetune", {})) <= {"steps", "warmup_steps"}  # a shorter fine-tune, never a longer one
    assert config.finetune.steps <= reference.finetune.steps
    assert set(work.get("compress", {})) <= {"iters_per_epoch", "calibration_batches", "rounds"}
    assert config.eval_examples <= PRESETS[preset].get("eval_examples", config.eval_examples)
    extra = settings.pipeline_config({"compress": {"target_ratio": 0.5}})
    assert extra.compress.size == SizeRule.target(0.5)


def test_the_text_notebook_runs_the_text_preset_with_less_work_or_the_smoke_preset_on_wikitext_2():
    """Notebook 06 runs the text preset with only amounts of work cut (steps, windows, batches), never its method."""
    embedded = notebook_settings({}).text_config()
    reference = make_config("text")
    work = {  # (section or None, field): each cut, none raised
        (None, "eval_windows"), ("finetune", "steps"), ("compress", "calibration_batches"),
        ("compress", "iters_per_epoch"), ("recover", "steps"), ("recover", "warmup_steps")}
    for section, name in work:
        ours = getattr(getattr(embedded, section) if section else embedded, name)
        theirs = getattr(getattr(reference, section) if section else reference, name)
        assert ours <= theirs, (section, name)
    assert embedded.eval_windows < reference.eval_windows and embedded.finetune.steps < reference.finetune.steps
    same_method = dataclasses.replace(
        embedded, eval_windows=reference.eval_windows,
        finetune=dataclasses.replace(embedded.finetune, steps=reference.finetune.steps),
        compress=dataclasses.replace(embedded.compress, calibration_batches=reference.compress.calibration_batches,
                                     iters_per_epoch=reference.compress.iters_per_epoch),
        recover=dataclasses.replace(embedded.recover, steps=reference.recover.steps,
                                    warmup_steps=reference.recover.warmup_steps))
    assert same_method == reference
    tiny = notebook_settings({NOTEBOOK_MODEL_ENV: TINY_MODEL}).text_config()
    assert (tiny.model, tiny.preset, tiny.data, tiny.window) == (TINY_MODEL, "smoke", "wikitext-2", 64)


def test_block_index_reads_the_transformer_block():
    assert block_index(LAYER) == 1 and block_index("transformer.h.11.attn.c_attn") == 11
    assert block_index("lm_head") is None


def test_rank_table_follows_dense_basis_and_exported_forms():
    model = make_tiny_llama(tied=True)
    dense = rank_table(model)
    assert [row["layer"] for row in dense] == compressible_linear_names(model)  # tied lm_head left out
    assert all(row["rank"] == row["full_rank"] and row["params"] == row["dense_params"] for row in dense)
    layers = to_basis_form(model, aux_rank=2)
    layers[LAYER].keep(torch.arange(5))
    row = {r["layer"]: r for r in rank_table(model)}[LAYER]
    assert row["rank"] == 5 and row["params"] == min((5 + 2) * (64 + 32), 64 * 32) and row["type"] == "BasisLinear"
    assert row["kind"] == "mlp.down_proj" and row["block"] == 1
    to_exported_form(model)
    row = {r["layer"]: r for r in rank_table(model)}[LAYER]
    assert row["rank"] == 7 and row["params"] == 7 * (64 + 32) and row["type"] == "LowRankLinear"


def _inputs(n: int = 400, width: int = 24, seed: int = 0) -> torch.Tensor:
    """Anisotropic inputs (N, in): a few directions carry most of the energy, as activations do."""
    generator = torch.Generator().manual_seed(seed)
    scales = torch.logspace(1, -2, width, dtype=torch.float64)  # (in,)
    return torch.randn(n, width, generator=generator, dtype=torch.float64) * scales


def test_truncation_errors_are_the_relative_output_errors_of_the_first_k_bases():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(16, 24, generator=generator)  # (out, in)
    x = _inputs()  # (N, in)
    covariance = x.T @ x / x.shape[0]  # (in, in)
    for bases in (svd_bases(weight), whitened_bases(weight, covariance.float())):
        errors = truncation_errors(weight, bases, covariance)
        assert errors.shape == (17,) and float(errors[0]) == pytest.approx(1.0)
        u, s, v = (t.double() for t in bases)
        y = x @ weight.double().T  # (N, out)
        for k in (0, 3, 8, 16):
            y_k = x @ ((u[:, :k] * s[:k]) @ v[:, :k].T).T
            assert float(errors[k]) == pytest.approx(float((y_k - y).norm() / y.norm()), rel=1e-6, abs=1e-6)
        assert float(errors[-1]) < 1e-5  # the bases are exact
    plain = truncation_errors(weight, svd_bases(weight), covariance)
    white = truncation_errors(weight, whitened_bases(weight, covariance.float(), damping=0.0), covariance)
    assert torch.all(white <= plain + 1e-6) and float(white[8]) < 0.5 * float(plain[8])  # whitening minds the inputs
    # with the identity as covariance it is the weight error, which the plain SVD minimises (Eckart-Young)
    s = svd_bases(weight)[1].double()
    frobenius = truncation_errors(weight, svd_bases(weight), torch.eye(24))
    torch.testing.assert_close(frobenius[:-1], (s.square().flip(0).cumsum(0).flip(0) / s.square().sum()).sqrt(),
                               atol=1e-6, rtol=1e-5)
    with pytest.raises(BSIError, match="no output"):
        truncation_errors(weight, svd_bases(weight), torch.zeros(24, 24))


def test_profile_rows_give_one_row_per_batch_as_the_sources_measure():
    model, layer = _one_layer()
    batches = [_batch(1), _batch(2)]
    losses, grads, curvatures = profile_rows(GradientOnly(), model, layer, torch.arange(layer.rank), batches, lm_loss)
    assert curvatures is None and grads.shape == (2, layer.rank)
    for n, batch in enumerate(batches):
        loss, (grad,) = sigma_gradients(model, [layer], batch, lm_loss)
        torch.testing.assert_close(grads[n], grad)
        assert float(losses[n]) == pytest.approx(float(loss))
    pool = torch.tensor([2, 5, 11])
    _, fisher_grads, fisher = profile_rows(Fisher(), model, layer, pool, batches, lm_loss)
    torch.testing.assert_close(fisher_grads, grads)
    outside = torch.ones(layer.rank, dtype=torch.bool)
    outside[pool] = False
    assert torch.all(fisher > 0)  # the Fisher measures every basis, whatever the pool
    _, _, masked = profile_rows(Fisher(measures_every_basis=False), model, layer, pool, batches, lm_loss)
    assert torch.all(masked[:, outside] == 0) and torch.equal(masked[:, pool], fisher[:, pool])
    # independently: N * sum over examples of (example's share of the mean-loss gradient)^2
    batch = batches[0]
    count = lm_loss.count(batch)
    per_example = []
    for b in range(batch["input_ids"].shape[0]):
        one = {"input_ids": batch["input_ids"][b:b + 1]}
        _, (g,) = sigma_gradients(model, [layer], one, lm_loss)
        per_example.append(g * lm_loss.count(one) / count)
    expected = count * torch.stack(per_example).square().sum(0)
    torch.testing.assert_close(fisher[0, pool], expected[pool], rtol=1e-4, atol=1e-8)
    with pytest.raises(BSIError, match="at least one batch"):
        profile_rows(GradientOnly(), model, layer, pool, [], lm_loss)


def test_repeated_hutchinson_rows_are_z_times_hz_and_average_to_the_diagonal():
    model, layer = _one_layer(make_tiny_llama().double())
    batch = _batch()
    pool = torch.tensor([1, 4, 9, 20, 30])
    hessian = exact_hessian(model, layer, batch, lm_loss, pool)  # (5, 5) the ground truth
    source = Hutchinson(eps=1e-4, scope="model", center="average")
    _, _, rows = profile_rows(source, model, layer, pool, [batch] * 200, lm_loss, torch.Generator().manual_seed(3))
    assert rows.shape == (200, layer.rank)
    outside = torch.ones(layer.rank, dtype=torch.bool)
    outside[pool] = False
    assert torch.all(rows[:, outside] == 0)
    replay = torch.Generator().manual_seed(3)
    for row in rows[:3]:
        z = probe_vector(layer.rank, pool, replay)[pool].double()
        torch.testing.assert_close(row[pool].double(), z * (hessian @ z), atol=1e-5, rtol=1e-3)
    diag = hessian.diagonal()
    one = float((rows[0, pool].double() - diag).norm() / diag.norm())
    many = float((rows[:, pool].double().mean(0) - diag).norm() / diag.norm())
    assert many < 0.2 and many < one


def test_loss_change_when_dropped_measures_and_restores():
    model, layer = _one_layer()
    batches = [_batch(1), _batch(2)]
    sigma = layer.sigma.detach().clone()
    changes = loss_change_when_dropped(model, layer, batches, lm_loss, [0, 7])
    assert torch.equal(layer.sigma.detach(), sigma)
    with torch.no_grad():
        base = sum(float(lm_loss(model, b)) for b in batches) / 2
        layer.sigma.data[7] = 0
        dropped = sum(float(lm_loss(model, b)) for b in batches) / 2
        layer.sigma.data.copy_(sigma)
    assert float(changes[1]) == pytest.approx(dropped - base, abs=1e-6)


def test_rank_history_follows_a_real_compression():
    model = make_tiny_llama()
    config = CompressConfig(size=SizeRule.target(0.5), rounds=2, iters_per_epoch=4, sampling_ratio=0.5, aux_rank=1,
                            bases="svd")
    rounds = [r for r in Compressor(model, token_batches(), config, lm_loss).run() if hasattr(r, "layers")]
    history = rank_history(rounds)
    assert list(history) == list(basis_layers(model))
    for name, layer in basis_layers(model).items():
        assert len(history[name]) == 3 and history[name][-1] == layer.rank
        assert history[name][0] == min(layer.in_features, layer.out_features)
        assert history[name] == sorted(history[name], reverse=True)
    assert sum(h[0] - h[-1] for h in history.values()) == sum(r.removed for r in rounds) > 0
    assert rank_history(rounds, {LAYER: 99})[LAYER][0] == 99


def test_result_of_returns_what_the_generator_returns():
    def reports():
        yield "step 1"
        yield "step 2"
        return {"done": True}

    assert result_of(reports()) == {"done": True}


def test_doc_markdown_fences_literal_blocks():
    text = doc_markdown(BasisLinear)
    assert text.startswith("**`bsi.method.layers.BasisLinear(") and "``" not in text
    module_text = doc_markdown(__import__("bsi.method.layers", fromlist=["x"]))
    assert module_text.startswith("**`bsi.method.layers`**") and "```\nW~ = U diag(sigma) V^T" in module_text
    assert module_text.count("```") % 2 == 0

    def undocumented():
        pass

    with pytest.raises(BSIError, match="no docstring"):
        doc_markdown(undocumented)


def test_doc_markdown_quotes_the_first_paragraphs_and_links_the_file_with_the_rest():
    import bsi.method.layers as layers

    whole = doc_markdown(layers)
    for count in (1, 2, 3):
        text = doc_markdown(layers, paragraphs=count)
        quoted, rest = text.rsplit("\n\n", 1)
        assert whole.startswith(quoted) and len(quoted) < len(whole)  # the library's own text, its beginning
        assert len(quoted.split("\n\n")) == count + 1 or "```" in quoted  # the title, then `count` paragraphs
        assert quoted.count("```") % 2 == 0  # a code block is never cut in two
        assert rest == ("*The rest of `bsi.method.layers`'s docstring: "
                        "[`bsi/method/layers.py`](../bsi/method/layers.py).*")
        assert (ROOT / "notebooks" / "../bsi/method/layers.py").resolve().is_file()  # from notebooks/, where it is read
    assert len(doc_markdown(layers, paragraphs=3)) > len(doc_markdown(layers, paragraphs=1))
    cut = doc_markdown(CompressConfig, paragraphs=1, root="../../")
    assert cut.endswith("[`bsi/config/settings.py`](../../bsi/config/settings.py).*") and "CompressConfig" in cut.splitlines()[-1]
    short = doc_markdown(result_of, paragraphs=50)  # no more paragraphs than asked: nothing cut, no link
    assert short == doc_markdown(result_of) and "The rest of" not in short
    with pytest.raises(BSIError, match="paragraphs must be at least 1"):
        doc_markdown(layers, paragraphs=0)




def test_defaults_table_reads_its_values_from_the_config():
    paper, ours = PROTOCOLS["paper"]["compress"], CompressConfig()
    flat = ours.to_dict()  # the settings by the names files and protocols use (eps_floor: the hutchinson section's)
    assert all(flat[key] == value for key, value in PROTOCOLS["tuned"]["compress"].items())  # tuned = defaults
    rows = {row["setting"]: row for row in defaults_rows()}
    for setting, key in [("bases", "bases"), ("curvature", "curvature"), ("selection", "selection"),
                         ("cut cap", "max_cut_factor"), ("score window", "score_window"),
                         ("first-order terms", "gradient_z"), ("eps floor", "eps_floor")]:
        assert paper[key] != flat[key]
        assert rows[setting]["paper"].count(f"`{paper[key]}`") == 1
        assert f"`{flat[key]}`" in rows[setting]["bsi"]
    assert f"`{paper['probe_scope']}`" in rows["curvature"]["paper"]  # the published probe over the whole model
    assert rows["size rule"]["paper"].startswith("`keep`") and "keep" in SIZE_MODES
    assert f"`{ours.size.mode}`" in rows["size rule"]["bsi"] and f"`{ours.size.ratio}`" in rows["size rule"]["bsi"]
    assert f"{ours.rounds} rounds of {ours.round_length} iterations" in rows["schedule"]["bsi"]
    table = defaults_table_markdown("../docs/").splitlines()
    assert len(table) == 2 + len(rows) and all(line.count("|") == 6 for line in table)
    assert "](../docs/method.md#" in table[2] and "](docs/method.md#" in defaults_table_markdown().splitlines()[2]


def test_defaults_table_links_to_headings_that_exist():
    anchors = heading_anchors(ROOT / "docs" / "method.md")
    assert set(METHOD_SECTIONS.values()) <= anchors
    linked = set(re.findall(r"method\.md#([\w-]+)", defaults_table_markdown()))
    assert linked and linked <= anchors


def test_further_reading_cites_both_papers():
    assert len(FURTHER_READING) == 2
    assert all("arXiv:" in ref and "https://arxiv.org/abs/" in ref for ref in FURTHER_READING)


def test_doc_markdown_turns_rst_tables_roles_and_doctests_into_markdown():
    def documented():
        """Pick a method (:func:`~bsi.pipeline.methods.method_for`, :class:`bsi.config.CompressConfig`).

        ==========  ========================
        name        what it keeps
        ==========  ========================
        svd         each layer's top-k
        basel       the largest ``|sigma|``,
                    after re-learning
        ==========  ========================

        See :mod:`bsi.method` and :meth:`Pipeline.run_engine <bsi.pipeline.runner.Pipeline.run_engine>`::

            x = W s   # verbatim, :func:`kept`

        >>> documented()  # doctest: +SKIP
        42
        """

    text = doc_markdown(documented, title=False)
    assert text.splitlines()[0] == "Pick a method (`method_for`, `bsi.config.CompressConfig`)."
    assert "| name | what it keeps |\n|---|---|\n| svd | each layer's top-k |\n" in text
    assert "| basel | the largest `\\|sigma\\|`, after re-learning |" in text  # continuation line joined
    assert "=====" not in text and ":func:" not in text.split("```")[0] and ":mod:" not in text
    assert "See `bsi.method` and `Pipeline.run_engine`:\n\n```\nx = W s   # verbatim, :func:`kept`\n```" in text
    assert "```python\n>>> documented()\n42\n```" in text and "doctest" not in text


def test_doc_markdown_of_the_notebooks_modules_keeps_no_rst():
    import bsi.analysis.stats
    import bsi.pipeline.methods
    import bsi.pipeline.perplexity

    for module in (bsi.pipeline.methods, bsi.analysis.stats, bsi.pipeline.perplexity):
        prose = doc_markdown(module).split("```")[::2]  # outside the fences
        assert not any(re.search(r"^\s*=+\s+=+", part, re.M) or re.search(r":(func|class|mod|meth|data):`", part)
                       for part in prose)
    assert "| svd | each layer's top-k singular triplets |" in doc_markdown(bsi.pipeline.methods)
