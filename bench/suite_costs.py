"""Costs the test suite pays, each against the way it was paid before, measured in one run.

    python bench/suite_costs.py                      # -> data/speed/suite-costs-DATE.json
    python bench/suite_costs.py --out runs/c.json --parts gzip,startup

* **conversion**: the embedded model's GGUF file converted into an empty
  cache by :func:`bsi.models.convert_gguf` (one parse of the file, shared by
  transformers' three readings, and one table of gguf's tensor names,
  shared by its walk over the submodules: :func:`bsi.models._gguf_parsed_once`)
  and by the same three transformers calls without either; the SHA-256
  of every file of the two folders, which must agree.
* **kaleido**: the same three plotly figures drawn to PNG twice, each time
  in a browser of its own (what ``notebooks/render.py`` did per notebook),
  then twice in one browser left open (``render.one_browser``).
* **gzip**: a shipped run's per-layer round records
  (``data/runs/*/rounds-layers.jsonl.gz``) compressed at zlib levels 1, 6
  and 9: seconds and bytes.
* **startup**: ``make test``'s pytest command with every test deselected
  (``-k`` matching none): the controller's start, two workers' start and
  their collection of the whole suite, the seconds before the first test
  can run. Against it, interleaved, the same command with a plugin that
  imports what ``tests/conftest.py`` and the notebook tests imported at
  their top before (torch, transformers' Llama, nbformat), on the
  controller and on every worker (:data:`EAGER_IMPORTS`).
* **launches**: the three two-process runs of ``tests/test_distributed.py``
  in one ``torchrun`` launch (as the test runs them) and in three launches
  of one run each (as they ran before), interleaved.

Run it with nothing else running: the figures are seconds on this machine.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from common import machine

from bsi.files import atomic_write_json

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "data" / "runs" / "gemma3-270m-text" / "rounds-layers.jsonl.gz"


def folder_digests(folder: Path) -> dict[str, str]:
    """``{file name: SHA-256}`` of every file in ``folder``."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def conversion() -> dict[str, object]:
    """Seconds to convert the embedded model with its parse and name table shared and without; whether the folders agree."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bsi import models

    gguf = models.embedded_gguf_path()
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        shared = models.convert_gguf(gguf, Path(scratch) / "shared")
        shared_s = time.perf_counter() - start
        start = time.perf_counter()  # before: the same calls, each reading parsing the file and building the table again
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        models._forget_gguf(model)
        separate = Path(scratch) / "separate"
        model.save_pretrained(separate, safe_serialization=True)
        tokenizer.save_pretrained(separate)
        separate_s = time.perf_counter() - start
        same = folder_digests(shared) == folder_digests(separate)
    return {"shared_s": round(shared_s, 2), "transformers_alone_s": round(separate_s, 2), "same_files": same}


def kaleido_draws(rounds: int = 2) -> dict[str, object]:
    """Seconds to draw three figures, each time in a new browser and each time in one left open."""
    import plotly.graph_objects as go
    import plotly.io as pio

    sys.path.insert(0, str(ROOT / "notebooks"))
    from render import one_browser

    figures = [go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, n])) for n in range(3)]

    def draw(folder: Path) -> float:
        start = time.perf_counter()
        pio.write_images(figures, [folder / f"{n}.png" for n in range(3)], format="png", width=[600] * 3,
                         height=[400] * 3)
        return round(time.perf_counter() - start, 2)

    with tempfile.TemporaryDirectory() as scratch:
        own = [draw(Path(scratch)) for _ in range(rounds)]
        with one_browser():
            shared = [draw(Path(scratch)) for _ in range(rounds)]
    return {"figures": len(figures), "browser_each_time_s": own, "one_browser_s": shared}


def gzip_levels(path: Path = RECORDS) -> dict[str, object]:
    """Seconds and bytes to compress a run's round records at zlib levels 1, 6 and 9."""
    with gzip.open(path, "rb") as handle:
        raw = handle.read()
    levels = {}
    for level in (1, 6, 9):
        start = time.perf_counter()
        size = len(zlib.compress(raw, level))
        levels[str(level)] = {"seconds": round(time.perf_counter() - start, 3), "bytes": size}
    return {"file": str(path.relative_to(ROOT)), "raw_bytes": len(raw), "levels": levels}


#: the imports ``tests/conftest.py``, ``tests/test_notebooks.py`` and ``tests/test_walkthroughs.py`` made at their
#: top before they were moved into the functions that use them, as a pytest plugin (loaded by ``-p``)
EAGER_IMPORTS = ("import torch\nimport nbformat\nfrom nbclient import NotebookClient\n"
                 "from transformers import LlamaConfig, LlamaForCausalLM\n")


def startup(repeats: int = 2) -> dict[str, object]:
    """Seconds of ``make test``'s pytest command with no test selected, with and without the eager imports."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
               "--no-loadscope-reorder", "-k", "no_test_has_this_name"]
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "eager_imports.py").write_text(EAGER_IMPORTS)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [scratch, os.environ.get("PYTHONPATH")]))}
        seconds: dict[str, list[float]] = {"now_s": [], "eager_imports_s": []}
        for _ in range(repeats):
            for name, extra in (("eager_imports_s", ["-p", "eager_imports"]), ("now_s", [])):
                start = time.perf_counter()
                done = subprocess.run(command + extra, cwd=ROOT, env=env, capture_output=True, text=True)
                seconds[name].append(round(time.perf_counter() - start, 2))
                if done.returncode != 5:  # pytest's "no tests collected" (all deselected): anything else failed
                    raise SystemExit(f"suite_costs: pytest exited {done.returncode}: {done.stdout[-2000:]}")
    return {"command": " ".join(command[1:]), **seconds}


def launches(repeats: int = 1) -> dict[str, object]:
    """Seconds of the three two-process runs of tests/test_distributed.py in one torchrun launch and in three."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import run_two_processes
    from test_distributed import RUNS, SCRIPT

    def launch(groups: list[tuple[str, ...]]) -> float:
        with tempfile.TemporaryDirectory() as scratch:
            start = time.perf_counter()
            for n, group in enumerate(groups):
                root = Path(scratch) / str(n)
                root.mkdir()
                run_two_processes(SCRIPT, [str(root), *group], root / "cache", root, timeout=900)
            return round(time.perf_counter() - start, 2)

    seconds: dict[str, list[float]] = {"one_launch_s": [], "three_launches_s": []}
    for _ in range(repeats):
        seconds["three_launches_s"].append(launch([(name,) for name in RUNS]))
        seconds["one_launch_s"].append(launch([RUNS]))
    return {"runs": list(RUNS), **seconds}


#: every part this script can measure, by name, in the order it measures them
MEASURES = {"conversion": conversion, "kaleido": kaleido_draws, "gzip": gzip_levels, "startup": startup,
            "launches": launches}
PARTS = tuple(MEASURES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="the JSON to write (default: data/speed/suite-costs-DATE.json)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"the parts to measure, separated by commas (default: all of {', '.join(PARTS)})")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise SystemExit(f"suite_costs: --parts takes names from {', '.join(PARTS)}, separated by commas; "
                         f"got {args.parts!r}")
    if "kaleido" in parts and shutil.which("chromium") is None and not Path("/usr/bin/chromium").exists():
        raise SystemExit("suite_costs: kaleido needs Chromium: run `make chromium`, or leave kaleido out of --parts")
    today = datetime.date.today().isoformat()
    record: dict[str, object] = {"date": today, "machine": machine(),
                                 "command": "python bench/suite_costs.py" + ("" if parts == list(PARTS) else
                                                                             f" --parts {','.join(parts)}")}
    for part in parts:
        record[part] = MEASURES[part]()
    out = Path(args.out) if args.out else ROOT / "data" / "speed" / f"suite-costs-{today}.json"
    atomic_write_json(out, record)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
