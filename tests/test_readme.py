"""Every command the README shows runs as shown, and every link in the documents leads somewhere.

The README's ```bash blocks are read line by line (``#`` starts a comment):

* a ``make`` line must name real targets: ``make -n`` (print, do not run)
  accepts it, and the GPU set-up prints a torch install from PyTorch's CUDA
  index while the plain set-up keeps the CPU wheel;
* a ``bsi`` line must parse (every flag exists and takes its value) and, for
  a command that builds a run configuration, the configuration must
  validate;
* the cheap ones run, in order, on the tiny model in a temporary folder: the
  "Commands" block as shown, except ``--preset smoke`` (the tiny random
  model) for a compression and 8 problems for ``bsi eval``. The study sweep
  and the text preset (tens of minutes on the embedded model) and the GPU
  recipe (a CUDA device and the reader's own model) stop at the first two
  checks.

The generated table "the paper and bsi's defaults" is checked with the other
generated parts (tests/test_docs.py); here it is checked to be in the README.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from bsi.cli import build_parser, main
from bsi.cli.commands import build_config
from bsi.cli.docs import generate, walkthrough_list

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

#: README commands that do not run here: what each would cost. They still parse and validate.
NOT_RUN = {
    ("sweep", "study-quick"): "43 minutes on the embedded model",
    ("compress", "text"): "15 minutes on the embedded model",
}
#: The flags whose values the test changes to run on the tiny model, and to what.
TINY = {"--preset": "smoke", "--examples": "8"}


def bash_blocks(text: str) -> list[list[list[str]]]:
    """The commands of every ```bash block, one argv a line, comments dropped."""
    blocks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    return [[argv for line in block.splitlines() if (argv := shlex.split(line, comments=True))] for block in blocks]


def readme_commands() -> list[list[str]]:
    return [argv for block in bash_blocks(README.read_text(encoding="utf-8")) for argv in block]


def commands_block() -> list[list[str]]:
    """The README's "Commands" section's block: the commands the reader is shown to run in a row."""
    section = README.read_text(encoding="utf-8").split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    (block,) = bash_blocks(section)
    return block


def is_bsi(argv: list[str]) -> bool:
    return Path(argv[0]).name == "bsi"


def _id(argv: list[str]) -> str:
    return " ".join(argv)[:60]


MAKE_LINES = [argv for argv in readme_commands() if argv[0] == "make"]
BSI_LINES = [argv for argv in readme_commands() if is_bsi(argv)]


def dry_make(*args: str) -> subprocess.CompletedProcess:
    """``make -n ARGS`` in the repository: what make would run, nothing run."""
    return subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_readme_shows_the_commands_a_newcomer_needs():
    shown = {" ".join(argv[:2]) for argv in readme_commands()}
    assert {"make run", "make test", "make lab", "make walkthroughs", "make setup", "bsi compress", "bsi compare"} <= shown
    assert all(argv[0] == "make" or is_bsi(argv) for argv in readme_commands()), \
        "a README command is neither make nor bsi: teach this test how to check it"
    gpu = next(argv for argv in BSI_LINES if "--device" in argv)
    assert {"--model", "--dtype"} <= set(gpu) and gpu[gpu.index("--device") + 1] == "cuda"


@pytest.mark.parametrize("argv", MAKE_LINES, ids=_id)
def test_every_make_line_names_real_targets(argv):
    done = dry_make(*argv[1:])
    assert done.returncode == 0, done.stderr


def test_the_gpu_setup_installs_torch_from_the_cuda_index_and_the_cpu_setup_is_unchanged():
    """Checked as make would run it (``-B``: as if nothing were set up yet); not run on a GPU here."""
    gpu = dry_make("-B", "setup", "CUDA=cu130")
    cpu = dry_make("-B", "setup")
    assert gpu.returncode == 0 and cpu.returncode == 0, gpu.stderr + cpu.stderr
    torch_line = next(line for line in gpu.stdout.splitlines() if '"torch==' in line)
    assert "--index-url https://download.pytorch.org/whl/cu130" in torch_line and '"torch==2.13.0+cu130"' in torch_line
    assert ".bsi-installed-cu130" in gpu.stdout
    cpu_torch = next(line for line in cpu.stdout.splitlines() if '"torch==' in line)
    assert "--index-url" not in cpu_torch and '"torch==2.13.0"' in cpu_torch
    # everything after torch is the same set-up
    rest = [line for line in gpu.stdout.splitlines() if '"torch==' not in line and "bsi-installed" not in line]
    assert rest == [line for line in cpu.stdout.splitlines() if '"torch==' not in line and "bsi-installed" not in line]


@pytest.mark.parametrize("argv", BSI_LINES, ids=_id)
def test_every_bsi_line_parses_and_its_configuration_validates(argv):
    args = build_parser().parse_args(argv[1:])  # an unknown flag or a bad value raises here
    if args.command in ("compress", "sweep"):
        build_config(args)  # a preset, a value or a combination the pipeline refuses raises here


def test_the_defaults_table_is_the_generated_one():
    assert generate("defaults") in README.read_text(encoding="utf-8")


def test_the_walkthrough_list_states_only_measured_times_and_links_only_rendered_pages(tmp_path):
    """Before ``make walkthroughs`` nothing is claimed; after it, each page is linked with the time it measured."""
    shutil.copytree(ROOT / "notebooks" / "src", tmp_path / "notebooks" / "src")
    shutil.copy(ROOT / "notebooks" / "build.py", tmp_path / "notebooks" / "build.py")
    stems = sorted(p.stem for p in (tmp_path / "notebooks" / "src").glob("[0-9][0-9]_*.py"))
    before = walkthrough_list(tmp_path).splitlines()
    assert len(before) == len(stems) and all("not rendered yet" in line and "not measured" in line for line in before)

    pages = tmp_path / "docs" / "walkthroughs"
    pages.mkdir(parents=True)
    (pages / f"{stems[0]}.md").write_text("# rendered\n")
    times = {"date": "2026-11-26", "machine": {"cpu_cores": 2},
             "notebooks": {stems[0]: {"cached_s": 61.0, "not_cached_s": 250.0, "caches": True, "tiny_s": 9.0}}}
    (pages / "times.json").write_text(json.dumps(times))
    first, *others = walkthrough_list(tmp_path).splitlines()
    assert f"](docs/walkthroughs/{stems[0]}.md)" in first and "1 min 1 s" in first and "4 min 10 s" in first
    assert all("not rendered yet" in line and "not measured" in line for line in others)


def _tiny(argv: list[str]) -> list[str]:
    out = list(argv[1:])
    for flag, value in TINY.items():
        if flag in out:
            out[out.index(flag) + 1] = value
    return out + (["--quiet"] if out[0] == "compress" else [])


def test_the_commands_block_runs_as_shown_on_the_tiny_model(tmp_path, monkeypatch, capsys):
    """In a temporary folder (its runs/ and examples/), with its own bsi cache."""
    monkeypatch.setenv("BSI_CACHE", str(tmp_path / "cache"))
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    ran = []
    for argv in commands_block():
        preset = argv[argv.index("--preset") + 1] if "--preset" in argv else None
        if (argv[1], preset) in NOT_RUN:
            continue
        capsys.readouterr()
        assert main(_tiny(argv)) == 0, f"{' '.join(argv)}: {capsys.readouterr().err}"
        ran.append((argv, capsys.readouterr().out))
    assert {argv[1] for argv, _ in ran} >= {"compress", "eval", "compare", "export"}
    outs = {argv[argv.index("--out") + 1] for argv, _ in ran if "--out" in argv}
    for out in outs:
        assert (tmp_path / out / "config.json").is_file(), f"{out} holds no model"
    compared = next(text for argv, text in ran if argv[1] == "compare")
    models = next(argv[argv.index("--models") + 1] for argv, _ in ran if argv[1] == "compare").split(",")
    assert all(model in compared for model in models), "the comparison names each model it compares"
    assert "fine-tuned dense model" in compared.splitlines()[0], "a run is compared with the model it compressed"
    prompts = [json.loads(line) for line in (tmp_path / "examples" / "prompts.jsonl").read_text().splitlines() if line]
    assert all(next(iter(p.values()))[:30] in compared for p in prompts), "every prompt is answered"


# ------------------------------------------------------------------ links
DOCUMENTS = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchors(path: Path) -> set[str]:
    """The anchors a code host gives a Markdown file's headings (lower case, punctuation dropped, spaces to -)."""
    anchors, seen, fence = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        fence ^= line.startswith("```")
        if not fence and re.match(r"#{1,6} ", line):
            anchor = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            anchors.add(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
            seen[anchor] = seen.get(anchor, 0) + 1
    return anchors


@pytest.mark.parametrize("document", DOCUMENTS, ids=[str(d.relative_to(ROOT)) for d in DOCUMENTS])
def test_every_relative_link_and_anchor_leads_somewhere(document):
    broken = []
    for target in LINK.findall(document.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        file = (document.parent / path).resolve() if path else document
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file):
            broken.append(target)
    assert not broken, f"{document.name} links to what does not exist: {broken}"
