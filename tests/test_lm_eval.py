"""lm-evaluation-harness on bsi's folders: its command line as users call it, `bsi eval --lm-eval`, its refusals.

Every run here is offline: the tasks are bsi's own (bsi/data/lm_eval_tasks),
built from the package, and the model is the smoke preset's tiny export.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

from bsi.cli import main
from bsi.errors import BSIError
from bsi.pipeline import harness

pytest.importorskip("lm_eval", reason="lm-eval is part of the test extra: pip install -e '.[test]'")

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def smoke_export(tmp_path_factory):
    """`bsi compress --preset smoke`: a tiny compressed folder with its tokenizer (module-wide, built once)."""
    root = tmp_path_factory.mktemp("lm-eval")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BSI_CACHE", str(root / "cache"))
        assert main(["compress", "--preset", "smoke", "--quiet", "--eval-examples", "0", "--out", str(root / "m")]) == 0
    return root / "m"


def lm_eval_cli(folder: Path, out: Path, *extra: str) -> dict:
    """``lm_eval --model hf --model_args pretrained=FOLDER,trust_remote_code=True ... EXTRA``; returns its results JSON."""
    command = [sys.executable, "-m", "lm_eval", "--model", "hf",
               "--model_args", f"pretrained={folder},trust_remote_code=True",
               "--include_path", str(harness.TASKS_FOLDER), "--tasks", "bsi_wikitext2",
               "--output_path", str(out), *extra]
    env = {**os.environ, **OFFLINE, "HF_MODULES_CACHE": str(out / "hf-modules")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=out.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(out.rglob("results_*.json"))
    assert files, done.stdout[-2000:]
    return json.loads(files[-1].read_text())["results"]["bsi_wikitext2"]


def test_lm_eval_loads_an_export_with_parallelize_and_scores_as_its_python_api_on_bsis_model(smoke_export):
    """With parallelize=True lm-eval passes device_map, max_memory and offload_folder to the export's loader.

    The model is built from the command line's own ``--model_args`` string
    (``HFLM.create_from_arg_string``, what ``lm_eval --model hf`` calls), in
    this process: a new one would only import torch again and index lm-eval's
    ~1,000 task files (about 14 s). The command line itself, with its plain
    call (``device_map={"": device}`` only), is
    :func:`test_lm_eval_on_the_embedded_models_export`'s, on the real model.
    """
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    from bsi.pipeline.export import load_compressed

    def scores(lm) -> dict:
        return simple_evaluate(model=lm, tasks=["bsi_wikitext2"], task_manager=harness.task_manager(
            tasks=["bsi_wikitext2"]), limit=2)["results"]["bsi_wikitext2"]

    # on a CPU-only machine lm-eval's parallelize mode needs device cpu (the dense model's case too)
    spread = scores(HFLM.create_from_arg_string(f"pretrained={smoke_export},trust_remote_code=True,parallelize=True",
                                                {"batch_size": 1, "device": "cpu"}))
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        assert spread[metric] > 0
    assert spread["bits_per_byte,none"] < 8  # a language model's loss, not a uniform guess over 256 bytes: the real weights

    # the same model loaded by bsi and handed to lm-eval's Python API scores the same
    model, tokenizer = load_compressed(smoke_export)
    mine = scores(HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1))
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        assert mine[metric] == pytest.approx(spread[metric], rel=1e-4)


def test_bsi_eval_lm_eval_reports_the_shipped_tasks(smoke_export, capsys):
    assert main(["eval", "--model", str(smoke_export), "--lm-eval", "bsi_wikitext2,bsi_embedded_math",
                 "--limit", "2", "--device", "cpu", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tasks"] == ["bsi_wikitext2", "bsi_embedded_math"]
    assert result["samples"] == {"bsi_wikitext2": 2, "bsi_embedded_math": 2}
    text = result["metrics"]["bsi_wikitext2"]
    assert text["word_perplexity"] > text["byte_perplexity"] > 1  # a word spans several bytes
    assert result["metrics"]["bsi_embedded_math"]["exact_match"] in (0.0, 0.5, 1.0)


def test_bsis_own_tasks_build_without_reading_lm_evals_task_files():
    """Asked only for the tasks bsi ships, the manager skips lm-eval's own index; any other task reads it."""
    own = harness.task_manager(tasks=list(harness.SHIPPED_TASKS))
    assert set(harness.SHIPPED_TASKS) <= set(own.all_tasks) and len(own.all_tasks) < 20
    harness.check_tasks(list(harness.SHIPPED_TASKS), own)  # both build from the package alone
    everything = harness.task_manager(tasks=["bsi_wikitext2", "hellaswag"])
    assert {"bsi_wikitext2", "hellaswag"} <= set(everything.all_tasks) and len(everything.all_tasks) > 1000
    # the packages' folders are indexed once per process (a user's --include-path folder on every call)
    assert harness.task_manager(tasks=["hellaswag"]) is everything and harness.task_manager() is everything
    assert harness.task_manager(tasks=["bsi_wikitext2"]) is own


def test_shipped_tasks_read_bsis_own_data():
    """WikiText-2's test articles start at their level-one headings; the math problems are bsi compress's test set."""
    sys.path.insert(0, str(harness.TASKS_FOLDER))
    try:
        import bsi_tasks
    finally:
        sys.path.remove(str(harness.TASKS_FOLDER))
    from bsi.data import extract_answer, load_task

    articles = bsi_tasks.wikitext_2_test()["test"]["page"]
    assert len(articles) == 62  # as in the document-level WikiText-2 that lm-eval's own wikitext task reads
    assert all(a.lstrip(" ").startswith("= ") and not a.lstrip(" ").startswith("= =") for a in articles)
    assert sum(len(a) for a in articles) > 0.99 * len((harness.TASKS_FOLDER.parent / "wikitext-2" / "test.txt")
                                                        .read_text(encoding="utf-8").strip())
    assert bsi_tasks.split_articles(" = A = \n x \n = = B = = \n y \n = C = \n z \n") == \
        [" = A = \n x \n = = B = = \n y ", " = C = \n z "]
    problems = bsi_tasks.embedded_math_test(test_size=5)["test"]
    test = load_task("embedded-math", test_size=5, seed=0).test
    assert problems["question"] == [e.question for e in test]
    assert problems["gold"] == [extract_answer(e.answer) for e in test]
    assert bsi_tasks.score_answer({"gold": "19"}, ["She has 12 + 7 = 19.\n#### 19"]) == {"exact_match": 1.0}
    assert bsi_tasks.score_answer({"gold": "19"}, ["#### 18"]) == {"exact_match": 0.0}


def test_what_cannot_run_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """lm-eval missing, an unknown task, an unreadable task file: one line each, and no model is touched.

    The model path does not exist: an error about it would mean the model was looked at first.
    """
    missing_model = str(tmp_path / "no-model-here")
    bad = tmp_path / "tasks"
    bad.mkdir()
    (bad / "broken.yaml").write_text("task: broken\n  dataset_path: [unclosed\n")
    cases = [
        (["--lm-eval", "no_such_task"], "lm-eval has no task 'no_such_task'"),
        (["--lm-eval", "broken", "--include-path", str(bad)], "cannot read the task file"),
        (["--lm-eval", "bsi_wikitext2", "--include-path", str(tmp_path / "nowhere")], "is not a folder"),
        (["--lm-eval", " , "], "task names separated by commas"),
        (["--lm-eval", "bsi_wikitext2", "--perplexity"], "not both"),
        (["--limit", "3"], "go with --lm-eval"),
    ]
    for flags, message in cases:
        assert main(["eval", "--model", missing_model, *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if it were not installed
    assert main(["eval", "--model", missing_model, "--lm-eval", "bsi_wikitext2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install 'bsi[eval]'" in err and "\n" not in err
    with pytest.raises(BSIError, match="not installed"):
        harness.check_lm_eval()


#: the WikiText-2 test article the real model reads: a short whole one (a New York state highway's, 609 of SmolLM2's
#: tokens; the first article has 1,434, and the two shorter entries are formula fragments of another article), since
#: every token goes through the 135M model twice here (the command line, then the Python API) on one thread
ONE_ARTICLE = {"bsi_wikitext2": [14]}


@pytest.mark.slow
def test_lm_eval_on_the_embedded_models_export(tmp_path):
    """The real embedded model with low-rank layers, exported, through lm-eval's plain command line (one article).

    The four attention value/output projections of the first two blocks keep
    their 128 largest bases (of 192 and 576): they are exported as two-factor
    layers and the model stays a working one.
    """
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    from bsi.method.surgery import basis_layers, to_basis_form
    from bsi.models import load_model_and_tokenizer
    from bsi.pipeline.export import load_compressed, save_compressed

    model, tokenizer = load_model_and_tokenizer("embedded")
    names = [f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("v_proj", "o_proj")]
    to_basis_form(model, aux_rank=0, names=names)
    for layer in basis_layers(model).values():
        layer.keep(torch.arange(128))
    folder = save_compressed(model, tokenizer, tmp_path / "embedded", {"method": "bsi"})
    table = json.loads((folder / "config.json").read_text())["bsi_layers"]
    assert sorted(n for n, spec in table.items() if spec["kind"] == "lowrank") == sorted(names)

    result = lm_eval_cli(folder, tmp_path / "out", "--samples", json.dumps(ONE_ARTICLE))
    assert 0.5 < result["bits_per_byte,none"] < 2.0  # a working model on Wikipedia text (uniform bytes: 8)
    loaded, tokenizer = load_compressed(folder)
    api = simple_evaluate(model=HFLM(pretrained=loaded, tokenizer=tokenizer, batch_size=1), tasks=["bsi_wikitext2"],
                          task_manager=harness.task_manager(tasks=["bsi_wikitext2"]),
                          samples=ONE_ARTICLE)["results"]["bsi_wikitext2"]
    assert api["word_perplexity,none"] == pytest.approx(result["word_perplexity,none"], rel=1e-4)


def test_generation_tasks_are_prompted_through_a_chat_template_when_the_tokenizer_has_one(tmp_path):
    """bsi's rule for prompts (bsi.data.build_prompt), applied to lm-eval's --apply_chat_template."""
    plain, configured, own_file = (tmp_path / n for n in ("plain", "configured", "own-file"))
    for folder in (plain, configured, own_file):
        folder.mkdir()
    (plain / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    (configured / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (own_file / "chat_template.jinja").write_text("{{ messages }}")
    assert [harness.has_chat_template(f) for f in (plain, configured, own_file, tmp_path / "absent")] == \
        [False, True, True, False]


def test_the_general_text_bench_scores_a_run_and_its_dense_model_and_the_docs_table_reads_it(smoke_export, tmp_path,
                                                                                             monkeypatch):
    """bench/general_text.py on the smoke run: lm-eval on the run and its fine-tuned dense model, one JSON, one table.

    The script's ``main`` runs in this process, with the smoke run's cache (a new process would only import torch
    again); every task it reads is bsi's own, built from the package.
    """
    from bsi.cli.docs import general_text_table

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "general-text.json"
    monkeypatch.setenv("BSI_CACHE", str(smoke_export.parent / "cache"))
    bench = load_script(root / "bench" / "general_text.py", "bench_general_text")
    assert bench.main(["--runs", str(smoke_export), "--limit", "1", "--no-shipped", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["command"] == f"python bench/general_text.py --runs {smoke_export} --limit 1 --no-shipped --out {out}"
    (run,) = record["runs"]
    assert run["preset"] == "smoke" and run["task"] == "qa" and record["embedded_as_shipped"] is None
    assert len(run["dense_folder"]) == 16 and "/" not in run["dense_folder"]  # the cache key, not this machine's path
    for model in ("dense", "compressed"):
        assert run[model]["articles"] == 1 and 0 < run[model]["bits_per_byte"] < 8 and run[model]["word_perplexity"] > 1
    assert run["dense"] != run["compressed"]  # two different models were scored

    table = general_text_table(str(out))
    row = next(line for line in table.splitlines() if line.startswith("| `smoke`"))
    assert f"{run['compressed']['word_perplexity']:,.1f}" in row and f"{run['dense']['bits_per_byte']:.3f}" in row
    assert "the first 1 WikiText-2 test articles" in table and "bench/general_text.py" in table
    assert "Not measured yet" in general_text_table(str(tmp_path / "absent.json"))
