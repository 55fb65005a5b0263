"""Where the test suite's minutes go: every test's setup, call and teardown time, by test and by file, kept as data.

    python bench/test_durations.py                                                  # as make test runs it: 2 workers
    python bench/test_durations.py --workers 1 --out runs/one-process.json          # one process, every test on all cores
    python bench/test_durations.py --read runs/pytest.txt --out runs/durations.json # only read a pytest output

Without ``--out`` the record goes to ``data/speed/`` under a name that says
when, on which CPU and with how many workers it was measured
(``test-durations-2026-11-28-amd-epyc-2w.json``): the data is kept per
machine, and the newest record orders the files for the workers
(``tests/conftest.py``).

It runs pytest as ``make test`` does (``-n N --dist loadfile --no-loadscope-reorder`` for N > 1)
with ``--durations=0`` (``--raw FILE`` keeps its whole output) and writes
what pytest measured: the wall time it printed, its summary line,
each test's phases, and each file's sum. The sums are the work the tests
did; on one process they add up to the wall time less pytest's own start
and collection, on several workers they exceed it (the workers share it).
Run it with nothing else running: two torch processes on two cores slow
each other 5-10x.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # this checkout's bsi first
from common import machine

from bsi.files import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
#: one line of pytest's --durations report: "12.34s call     tests/test_x.py::test_y[a b]"
DURATION = re.compile(r"^(?P<seconds>\d+(?:\.\d+)?)s (?P<phase>setup|call|teardown)\s+(?P<test>\S.*)$")
#: pytest's last line: "1127 passed, 9 skipped, 3 warnings in 648.94s (0:10:48)"
SUMMARY = re.compile(r"^=*\s*(?P<counts>\d+ \w+.*?) in (?P<seconds>\d+(?:\.\d+)?)s")


def read_durations(text: str) -> dict[str, object]:
    """pytest's output -> its wall time, summary, per-test phases and per-file sums (seconds, 2 decimals)."""
    tests: dict[str, dict[str, float]] = collections.defaultdict(dict)
    wall, counts = None, None
    for line in text.splitlines():
        found = DURATION.match(line.strip())
        if found:
            tests[found["test"]][found["phase"]] = float(found["seconds"])
            continue
        summary = SUMMARY.match(line.strip())
        if summary:
            wall, counts = float(summary["seconds"]), summary["counts"]
    if wall is None:
        raise SystemExit("test_durations: no pytest summary line ('N passed ... in S s') in the output")
    files: dict[str, float] = collections.Counter()
    for test, phases in tests.items():
        files[test.split("::", 1)[0]] += sum(phases.values())
    return {
        "wall_s": wall,
        "summary": counts,
        "tests_timed": len(tests),
        "seconds_in_tests": round(sum(files.values()), 2),
        "files": {name: round(seconds, 2) for name, seconds in sorted(files.items(), key=lambda kv: -kv[1])},
        "tests": {name: phases for name, phases in sorted(tests.items())},
    }


def default_name(record: dict) -> str:
    """``test-durations-<date>-<cpu>-<workers>w.json``: the CPU's first two words, lower case, dashed."""
    words = re.findall(r"[a-z0-9]+", str(record["machine"].get("cpu", "cpu")).lower())
    words = [w for w in words if w not in ("r", "tm", "cpu", "processor")][:2] or ["cpu"]
    return f"test-durations-{record['date']}-{'-'.join(words)}-{record['workers']}w.json"


def table(record: dict, rows: int = 20) -> str:
    """The files that took longest, as a Markdown table."""
    lines = [f"{record['summary']} in {record['wall_s']:.0f} s; {record['seconds_in_tests']:.0f} s inside tests",
             "", "| file | seconds |", "|---|---|"]
    lines += [f"| {name} | {seconds:.1f} |" for name, seconds in list(record["files"].items())[:rows]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (2, as make test; 1: one process)")
    parser.add_argument("--read", default=None, help="read this saved pytest output instead of running the tests")
    parser.add_argument("--out", default=None, help="the JSON to write (default: data/speed/test-durations-DATE-CPU-Nw.json)")
    parser.add_argument("--raw", default=None, help="where to keep pytest's whole output (default: not kept)")
    parser.add_argument("--label", default="", help="a note kept in the JSON (what differs in this run)")
    args = parser.parse_args(argv)
    if args.read:
        text = Path(args.read).read_text(encoding="utf-8")
    else:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0", "--durations-min=0"]
        if args.workers > 1:
            command += ["-n", str(args.workers), "--dist", "loadfile", "--no-loadscope-reorder"]  # as make test
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        text = done.stdout + done.stderr
        if args.raw:
            atomic_write_text(args.raw, text)  # (it makes the folder too)
    now = datetime.datetime.now(datetime.timezone.utc)
    record = {"date": now.date().isoformat(), "time_utc": now.strftime("%H:%M"), "machine": machine(),
              "workers": args.workers, "label": args.label, **read_durations(text)}
    out = args.out or ROOT / "data" / "speed" / default_name(record)
    atomic_write_text(out, json.dumps(record, indent=1) + "\n")
    print(table(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
