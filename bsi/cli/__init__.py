"""Command line: ``bsi compress | export | eval | chat | presets | sweep | compare | answers | spectrum``.

The CLI is a thin consumer of the report generators: it turns
:mod:`bsi.reports` objects into progress bars and a closing table. What can
go wrong ends in one line on stderr, never a traceback:

* a bad command line (an unknown flag, a value out of range or not among the
  choices) and any :class:`~bsi.errors.BSIError`: ``bsi <command>: error:
  ...`` saying what to change, exit status 2 (:class:`Parser` replaces
  argparse's usage dump with that line, and suggests the closest flag);
* anything else, a bug or the machine: the line names the error, the full
  traceback goes to a file the line names, exit status 1; running out of
  memory gets advice from the command's own flags (a smaller batch,
  ``--gradient-checkpointing``, ``--fsdp``), see :func:`crash_message`;
* Ctrl-C says what was kept (``bsi compress`` prints the ``--resume`` command
  that continues the run), exit status 130; a reader that leaves early
  (``bsi presets | head``) ends the output quietly.

Each sub-command lives in a module of this package with
``add_arguments(parser)`` and ``run(args) -> int``. Building the parser
imports nothing heavy (the flags come from :mod:`bsi.config`, which does not
import torch); a command imports torch and transformers only when it runs, and
checks its configuration first, so ``bsi --help`` and argument errors answer
at once. Every flag's help ends with its default (:class:`HelpFormatter`).
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import importlib
import os
import platform
import re
import sys
import tempfile
import traceback

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
    "answers": ("bsi.cli.answers", "read what a run's or a sweep's models answered, problem by problem, marked"),
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


class UsageError(BSIError):
    """A bad command line, as one line: ``prog`` is the command it belongs to (``bsi eval``)."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


_CHOICE = re.compile(r"^argument (?P<flag>\S+): invalid choice: (?P<value>.*?) \(choose from (?P<choices>.*)\)$")
_CHECK = re.compile(r"^argument (?P<flag>\S+): (?P<rest>must .*)$")
_KIND = re.compile(r"^argument (?P<flag>\S+): invalid (?P<kind>\w+) value: (?P<value>.*)$")


def one_line(message: str) -> str:
    """argparse's error, worded like the configuration's: ``--dtype must be one of ..., got 'fp16'``."""
    if match := _CHOICE.match(message):
        flag, value = match["flag"], match["value"].strip("'\"")
        choices = [c.strip().strip("'\"") for c in match["choices"].split(",")]
        close = difflib.get_close_matches(value, choices, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        if flag == "COMMAND":
            return f"unknown command '{value}'{hint}; the commands: {', '.join(choices)}"
        return f"{flag} must be one of {', '.join(choices)}, got '{value}'{hint}"
    if match := _CHECK.match(message):
        return f"{match['flag']} {match['rest']}"
    if match := _KIND.match(message):
        kind = {"int": "a whole number", "float": "a number"}.get(match["kind"], f"a {match['kind']}")
        return f"{match['flag']} must be {kind}, got {match['value']}"
    return message


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage dump) that the CLI prints like any other.

    ``error`` raises :class:`UsageError`, so ``main`` answers a bad command
    line exactly as it answers a bad value found later: ``bsi <command>:
    error: ...`` and exit status 2. An unknown flag gets the closest one the
    command has.
    """

    def error(self, message: str):  # type: ignore[override]
        commands = _subparsers(self)
        if commands is not None and message.endswith("required: COMMAND"):
            message = f"give a command: {', '.join(commands.choices)} (`bsi --help` says what each does)"
        raise UsageError(self.prog, one_line(message))

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            command = _subparser(self, getattr(namespace, "command", None)) or self
            flags = [o for a in command._actions for o in a.option_strings]
            unknown = next((e for e in extras if e.startswith("-")), extras[0])
            close = difflib.get_close_matches(unknown.split("=")[0], flags, n=1)
            hint = f" (did you mean {close[0]}?)" if close else f"; `{command.prog} --help` lists the flags"
            raise UsageError(command.prog, f"unrecognized arguments: {' '.join(extras)}{hint}")
        return namespace


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser | None:
    """The parser of ``bsi COMMAND`` inside the top-level ``parser`` (None for no or an unknown command)."""
    commands = _subparsers(parser)
    return commands.choices.get(command) if commands is not None and command else None


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="bsi", description="Compress causal LMs with Basis Selection with Importance.")
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


def is_out_of_memory(err: BaseException) -> bool:
    """True for running out of GPU or CPU memory (torch's OutOfMemoryError, MemoryError, allocator failures)."""
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and any(
        words in text for words in ("out of memory", "can't allocate memory", "not enough memory"))


def memory_advice(flags: set[str]) -> str:
    """What to change when memory ran out, from the flags the command has."""
    advice = [f"lower {flag}" for flag in ("--batch-size", "--eval-batch-size") if flag in flags]
    if "--max-length" in flags:
        advice.append("shorten --max-length")
    if "--gradient-checkpointing" in flags:
        advice.append("turn on --gradient-checkpointing")
    if "--fsdp" in flags:
        advice.append("shard the bases over several GPUs with --fsdp under torchrun")
    if "--dtype" in flags:
        advice.append("use --dtype bfloat16 on a GPU")
    return ", ".join(advice) if advice else "free memory or use a machine with more"


def save_traceback(err: BaseException, argv: list[str]) -> str:
    """Write ``err``'s traceback, the command line and the versions to a new file in the temp folder; its path.

    Returns a phrase instead of a path when even that cannot be written.
    """
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        fd, path = tempfile.mkstemp(prefix=f"bsi-error-{stamp}-", suffix=".txt")
        versions = [f"python {platform.python_version()}"] + [
            f"{name} {getattr(sys.modules[name], '__version__', '?')}"
            for name in ("bsi", "torch", "transformers") if name in sys.modules]
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"bsi {' '.join(argv)}\n{', '.join(versions)}\n\n")
            f.write("".join(traceback.format_exception(err)))
        return path
    except OSError as write_error:
        return f"nowhere (it could not be saved: {write_error})"


def crash_message(err: BaseException, flags: set[str], saved_to: str) -> str:
    """The one line for an exception that is not a :class:`~bsi.errors.BSIError`.

    Out of memory: what to change (:func:`memory_advice`). Anything else is a
    bug in bsi: its type and first line, and where the traceback is.
    """
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    first = first if len(first) <= 200 else first[:197] + "..."
    if is_out_of_memory(err):
        said = f" ({first})" if first else ""
        return f"out of memory{said}: {memory_advice(flags)}; the full traceback is in {saved_to}"
    return (f"unexpected {type(err).__name__}{': ' + first if first else ''} (a bug in bsi: please report it "
            f"with the traceback, which is in {saved_to})")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``bsi`` command; returns the exit status."""
    from bsi.runtime import keep_freed_memory

    _quiet_libraries()
    keep_freed_memory()  # big tensors come and go all the time: reuse their memory (see bsi.runtime)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser = None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        status = _handlers(args.command)[1](args)
        _finish_output()
        return status
    except SystemExit:  # --help: its text, too, may meet a closed pipe
        _finish_output()
        raise
    except UsageError as err:
        print(f"{err.prog}: error: {err}", file=sys.stderr)
        return 2
    except BSIError as err:
        print(f"{_prog(args)}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{_prog(args)}: {_interrupted(args)}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left while we were still printing: say nothing more
        _finish_output()
        return 0
    except Exception as err:  # the last resort: a bug, or the machine (out of memory)
        command = _subparser(parser, args.command) if parser is not None and args is not None else None
        flags = {o for a in command._actions for o in a.option_strings} if command is not None else set()
        print(f"{_prog(args)}: error: {crash_message(err, flags, save_traceback(err, argv))}", file=sys.stderr)
        return 1


def _prog(args: argparse.Namespace | None) -> str:
    """``bsi eval``, or ``bsi`` before a command is known."""
    return f"bsi {args.command}" if args is not None else "bsi"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
