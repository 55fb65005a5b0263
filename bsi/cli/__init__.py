"""Command line: ``bsi compress | eval | chat | presets | sweep | compare | spectrum``.

The CLI is a thin consumer of the report generators: it turns
:mod:`bsi.reports` objects into progress bars and a closing table. Any
:class:`~bsi.errors.BSIError` becomes one line on stderr and exit status 2.

Each sub-command lives in a module of this package with
``add_arguments(parser)`` and ``run(args) -> int``. Building the parser
imports nothing heavy (the flags come from :mod:`bsi.config`, which does not
import torch); a command imports torch and transformers only when it runs, so
``bsi --help`` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from bsi.errors import BSIError

#: sub-command name -> (module, one-line help). Modules expose add_<name>/run_<name> or add_arguments/run.
COMMANDS: dict[str, tuple[str, str]] = {
    "compress": ("bsi.cli.commands", "run the three-stage pipeline (fine-tune, compress, recover) and save the model"),
    "eval": ("bsi.cli.commands", "measure accuracy and answer-token loss of a model on a task"),
    "chat": ("bsi.cli.commands", "chat with a model in the terminal"),
    "presets": ("bsi.cli.commands", "print the presets (or one, as a full JSON config)"),
    "sweep": ("bsi.cli.sweep", "compare methods (svd, svd-llm, fwsvd, asvd, basel, bsi-grad, bsi) across target sizes"),
    "compare": ("bsi.cli.compare", "generate from several models side by side for the same prompts"),
    "spectrum": ("bsi.cli.spectrum", "measure per-layer Hessian spectra in sigma-space (power-law fit, JSON, HTML)"),
}


def _handlers(name: str):
    module = importlib.import_module(COMMANDS[name][0])
    add = getattr(module, f"add_{name}", None) or module.add_arguments
    run = getattr(module, f"run_{name}", None) or module.run
    return add, run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bsi", description="Compress causal LMs with Basis Selection with Importance.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter if name != "compress" else argparse.HelpFormatter)
        _handlers(name)[0](p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``bsi`` command; returns the exit status."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging  # after parsing: --help never loads it

    hf_logging.disable_progress_bar()  # our own progress bars only; errors come as one line
    hf_logging.set_verbosity_error()
    run = _handlers(args.command)[1]
    try:
        return run(args)
    except BSIError as err:
        print(f"bsi {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bsi {args.command}: interrupted; nothing was written", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `bsi presets | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
