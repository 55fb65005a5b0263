"""How soon does a live run show its first round? The ``tour`` preset started in a real browser, timed.

Starts ``python app.py`` as a user does, opens the page in headless
chromium, presses **Start** on the form as it opens (the ``tour`` preset on
the embedded model) and times, from the click:

* the first round on screen (the status line says ``round 1/4``);
* Done (the status line says ``Done``).

It prints whether the fine-tune and the conversion were cached before the
run (``$BSI_CACHE``); the targets are with both warm (run it twice, or run
``bsi compress --preset tour`` once first). Nothing else should run on the
machine meanwhile.

    python bench/live_tour.py                       # --json FILE keeps the figures (data/speed/)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from common import machine  # noqa: E402

CHROMIUM = "/usr/bin/chromium"


def caches(preset: str) -> dict[str, bool]:
    """Whether this machine's cache holds the preset's fine-tune and conversion."""
    from bsi.config import resolve_config
    from bsi.pipeline.runner import Pipeline

    pipeline = Pipeline(resolve_config(preset))
    return {"finetune": (pipeline.finetune_folder / "config.json").is_file(), "conversion": pipeline.bases_cache.present}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the figures to this JSON file too")
    parser.add_argument("--port", type=int, default=7871)
    parser.add_argument("--screenshots", default=None, help="folder for a screenshot at round 1 and at Done")
    args = parser.parse_args(argv)
    from playwright.sync_api import expect, sync_playwright

    before = caches("tour")
    print(f"caches before: {before}", flush=True)
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(args.port)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "caches": before, "preset": "tour"}
    try:
        url = None
        while url is None:
            line = server.stdout.readline()
            if not line:
                raise SystemExit("app.py ended before it printed its address")
            found = re.search(r"(http://127\.0\.0\.1:\d+)", line)
            url = found.group(1) if found else None
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(url)
            expect(page.locator("#preset-menu input")).to_have_value(re.compile(r"^tour · "), timeout=60_000)
            status = page.locator("#job-status")
            page.locator("#start-button").click()
            clicked = time.monotonic()
            expect(status).to_contain_text(re.compile(r"round [1-4]/4|Done"), timeout=600_000)
            out["first_round_s"] = time.monotonic() - clicked
            print(f"first round on screen {out['first_round_s']:.1f} s after Start", flush=True)
            if args.screenshots:
                page.screenshot(path=str(Path(args.screenshots) / "live-tour-round1.png"), full_page=False)
            expect(status).to_contain_text("Done", timeout=600_000)
            out["done_s"] = time.monotonic() - clicked
            print(f"Done {out['done_s']:.1f} s after Start", flush=True)
            out["status"] = status.inner_text()
            if args.screenshots:
                page.screenshot(path=str(Path(args.screenshots) / "live-tour-done.png"), full_page=False)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=60)
    if args.json:
        from bsi.files import atomic_write_text

        atomic_write_text(args.json, json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
