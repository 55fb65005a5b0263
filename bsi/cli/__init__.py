"""Command line: ``bsi compress | export | eval | chat | presets | sweep | compare | spectrum``.

The CLI is a thin consumer of the report generators: it turns
:mod:`bsi.reports` objects into progress bars and a closing table. Any
:class:`~bsi.errors.BSIError` becomes one line on stderr and exit status 2;
Ctrl-C says what was kept (``bsi compress`` prints the ``--resume`` command
that continues the run); a reader that leaves early (``bsi presets | head``)
ends the output quietly.

Each sub-command lives in a module of this package with
``add_arguments(parser)`` and ``run(args) -> int``. Building the parser
imports nothing heavy (the flags come from :mod:`bsi.config`, which does not
import torch); a command imports torch and transformers only when it runs, and
checks its configuration first, so ``bsi --help`` and argument errors answer
at once. Every flag's help ends with its default (:class:`HelpFormatter`).
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
    "export": ("bsi.cli.commands", "write a compressed model as an ordinary dense transformers checkpoint"),
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


class HelpFormatter(argparse.HelpFormatter):
    """``--help`` that ends every flag's line with its default, once.

    A help text that already names its default (the config flags state the
    chosen preset's value, see :mod:`bsi.cli.flags`) is left alone; a required
    flag says so; an on/off switch shows ``(default: off)``; a flag whose
    default is None must say in its own text what leaving it out means.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        optional = action.option_strings or action.nargs in ("?", "*")
        if "(default" in text or action.default is argparse.SUPPRESS or not optional:
            return text
        if action.required:
            return f"{text} (required)"
        if isinstance(action.default, bool) and action.nargs == 0:
            return f"{text} (default: {'on' if action.default else 'off'})"
        if action.default is None:
            return text
        return f"{text} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bsi", description="Compress causal LMs with Basis Selection with Importance.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        _handlers(name)[0](p)
    return parser


def _quiet_libraries() -> None:
    """Our own progress bars and one-line errors only.

    Set through the environment, before transformers is imported (a command
    that fails on its arguments never imports it); when it already is (``main``
    called in-process), through its logging module.
    """
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()


def _interrupted(args: argparse.Namespace | None) -> str:
    """What Ctrl-C leaves behind, for the commands that keep something (compress says it itself)."""
    if args is not None and args.command == "sweep":
        return (f"interrupted; the finished cells are kept in {args.out}: run the same command again "
                "to continue with the others")
    return "interrupted; nothing was written"


def _finish_output() -> bool:
    """Flush stdout now, so that a reader who left (``bsi presets | head``) shows up here, not at exit.

    Returns False when the reader left; stdout then points at /dev/null so
    that the interpreter's own final flush stays quiet.
    """
    try:
        sys.stdout.flush()
        return True
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return False


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``bsi`` command; returns the exit status."""
    _quiet_libraries()
    args = None
    try:
        args = build_parser().parse_args(argv)
        status = _handlers(args.command)[1](args)
        _finish_output()
        return status
    except SystemExit:  # --help and argument errors: their text, too, may meet a closed pipe
        _finish_output()
        raise
    except BSIError as err:
        print(f"bsi {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bsi{' ' + args.command if args else ''}: {_interrupted(args)}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left while we were still printing: say nothing more
        _finish_output()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
