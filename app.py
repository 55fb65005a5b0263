"""The live compression studio: ``python app.py`` (or ``make app``), then open the printed address.

Tabs: Compress (run BSI and watch each step and round), Inspect (every
basis' sigma, the score's terms and importance), Spectra (exact
Hessian spectrum of a layer, power-law fit, probes-needed calculator), Chat
(the compressed model next to the run's fine-tuned dense model, one message
or a whole prompts file), Answers (a run's and a sweep's answers, marked),
Compare (a sweep's accuracy against size) and Help. It opens on the run and
the study shipped in ``data/``, so every tab has real content before the
first click. The app binds 127.0.0.1 and shares nothing publicly unless
``--share`` is given.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import time


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    parser.add_argument("--share", action="store_true", help="also open a public gradio.live link (off by default)")
    from bsi.config import PRESETS  # light: no torch

    parser.add_argument("--preset", default="tour", choices=list(PRESETS),
                        help="preset the form starts from: tour (the embedded model, under two minutes), "
                             "default (the best trade, minutes) or smoke (tiny model, seconds)")
    parser.add_argument("--run-dir", default=None,
                        help="finished run the dashboard opens on (default: the run shipped in data/; '' for none)")
    parser.add_argument("--sweep-dir", default=None,
                        help="sweep the Compare and Answers tabs open on (default: the study shipped in data/)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from bsi.runtime import keep_freed_memory

    keep_freed_memory()  # reuse freed tensor memory instead of faulting it in again (see bsi.runtime)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from bsi.app import build_app
    from bsi.app.form import MAX_UPLOAD_BYTES
    from bsi.app.layout import startup_lines

    hf_logging.disable_progress_bar()  # the app shows progress itself; the console stays readable
    demo = build_app(preset=args.preset, sweep_dir=args.sweep_dir, run_dir=args.run_dir)
    # quiet: Gradio's own lines would suggest `share=True in launch()`; the app's switch is --share
    demo.queue().launch(server_name=args.host, server_port=args.port, share=args.share,
                        max_file_size=MAX_UPLOAD_BYTES, quiet=True, prevent_thread_lock=True)
    # a service manager's stop (SIGTERM) ends it as Ctrl-C does: the server closes and, as Python exits, the
    # app's temporary files go (bsi.app.layout.build_app); set before the address is printed, which is when a
    # caller may start to stop it. The first stop also turns both signals off, so that a second one (Ctrl-C
    # pressed twice, a stop script that sends two) cannot break into the close with a traceback; Ctrl-C keeps
    # its own handler only where it has one (it is ignored in a job started in the background)
    def stop(signum, frame):
        for number in stopping:
            signal.signal(number, signal.SIG_IGN)
        raise KeyboardInterrupt

    stopping = [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT) is signal.default_int_handler
                                   else [])
    for number in stopping:
        signal.signal(number, stop)
    try:
        print("\n".join(startup_lines(demo.local_url, demo.share_url)), flush=True)
        while demo.is_running:  # until Ctrl-C, which may also land in the print above
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    # demo.close(), not Gradio's own Ctrl-C path (demo.block_thread()): that one stops the HTTP server but leaves
    # the heartbeat stream of every open page and client running, and Gradio waits 5 s for the server's thread
    # before it gives up on it; close() ends those streams first. A client's queue stream can still wait up to 10 s
    # for its next message, so the server is told not to wait for open connections at all (force_exit, what a
    # second Ctrl-C tells uvicorn); the requests it then cancels are the stop's doing, not errors to print. From
    # SIGTERM to exit with a client connected after a run: 6.4-6.6 s -> 1.6 s (python bench/gpu_dashboard.py
    # --preset smoke, its stopped_s; data/speed/app-stop-2026-12-02-intel-xeon.json)
    if demo.server is not None:
        demo.server.force_exit = True
        logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
    demo.close()
    server_thread = getattr(demo.server, "thread", None)
    if server_thread is not None and server_thread.is_alive():  # Gradio gave up waiting for it
        print("bsi: the server was still running 5 s after the stop; exiting without it", flush=True)


if __name__ == "__main__":
    main()
