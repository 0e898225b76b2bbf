"""``pulsar-nack``: the command line (``demo``, ``broker``, and ``bench`` in a source checkout).

Each subcommand lives in its own module and contributes ``add_arguments(parser)`` and
``run(args) -> int``; this module only wires them to argparse, importing them on use.
``bench`` runs from a source checkout only (``bench/`` is not in the wheel): elsewhere it
is not listed, and running it says so (exit code 2).

No command shows a traceback: an unexpected error is one line on stderr and exit code
:data:`UNEXPECTED` (70); ``PULSAR_NACK_DEBUG=1`` shows the traceback instead. Ctrl-C is
exit code 130.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from .. import __version__

__all__ = ["DEBUG_ENV", "INTERRUPTED", "UNEXPECTED", "main"]

UNEXPECTED = 70
"""Exit code of an unexpected error (sysexits' EX_SOFTWARE): a bug, reported in one line."""
INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), as a shell reports it."""
DEBUG_ENV = "PULSAR_NACK_DEBUG"
"""Set (to anything but empty) to see an unexpected error's traceback."""
_EPILOG = (
    "Exit codes: 0 done; 2 bad usage, or something to install or start first (one line on stderr); "
    f"{UNEXPECTED} an unexpected error (one line; {DEBUG_ENV}=1 shows its traceback); {INTERRUPTED} Ctrl-C. "
    "Each command's --help lists its own."
)

# subcommand -> (module, one-line help)
_COMMANDS = {
    "demo": ("pulsar_nack.cli.demo", "run the Spark pipeline on a test broker and print a summary"),
    "broker": ("pulsar_nack.cli.broker", "start a test broker, print its URL, run until Ctrl-C"),
    "bench": ("bench.cli", "run the benchmarks (tracker vs hash-map baseline vs built-in client)"),
}


def _import_command(module_name: str) -> ModuleType:
    """Import a subcommand's module; ``bench`` also from a checkout in the working directory.

    ``bench/`` is not in the wheel: an installed ``pulsar-nack`` script cannot import it,
    since a script's directory, not the working directory, is first on ``sys.path``. Run
    from a checkout's root, the command loads that ``bench`` package by its path.
    """
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        package = module_name.partition(".")[0]
        init = Path.cwd() / package / "__init__.py"
        if error.name != package or package != "bench" or not init.is_file():
            raise
    spec = importlib.util.spec_from_file_location(package, init, submodule_search_locations=[str(init.parent)])
    assert spec is not None and spec.loader is not None  # (a file location always gives a loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[package] = module
    spec.loader.exec_module(module)
    return importlib.import_module(module_name)


def plain(text: str) -> str:
    """*text* without reStructuredText's double backticks, for ``--help``.

    >>> plain("``pulsar-nack``: the command line (``demo``)")
    'pulsar-nack: the command line (demo)'
    """
    return text.replace("``", "")


class _PlainHelpParser(argparse.ArgumentParser):
    """An ArgumentParser whose description and option help lose RST double backticks."""

    def format_help(self) -> str:
        return plain(super().format_help())


def _unavailable(name: str, error: ImportError) -> str:
    return (
        f"pulsar-nack {name} needs a source checkout of pulsar-nack: {name}/ is not part of the installed "
        f"package ({error}); run it from the root of a checkout, e.g. `cd pulsar-nack && pulsar-nack {name} --quick`"
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pulsar-nack`` script; returns the exit code (see the module notes)."""
    try:
        return _run(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        print("pulsar-nack: interrupted", file=sys.stderr, flush=True)
        return INTERRUPTED
    except Exception as error:
        if os.environ.get(DEBUG_ENV):
            raise
        what = " ".join(str(error).split()) or "(no message)"
        print(f"pulsar-nack: unexpected error: {type(error).__name__}: {what} (set {DEBUG_ENV}=1 to see the traceback)",
              file=sys.stderr, flush=True)
        return UNEXPECTED


def _command_of(argv: list[str]) -> str | None:
    """The subcommand *argv* names (its first word that is not an option), or None."""
    return next((word for word in argv if not word.startswith("-")), None)


def _run(argv: list[str]) -> int:
    parser = _PlainHelpParser(prog="pulsar-nack", description=__doc__.split("\n\n")[0], epilog=_EPILOG)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_PlainHelpParser)
    modules = {}
    for name, (module_name, help_text) in _COMMANDS.items():
        try:
            module = _import_command(module_name)
        except ImportError as error:  # bench/ is not in the wheel: not listed; named, it says why
            if _command_of(argv) == name:
                print(_unavailable(name, error), file=sys.stderr)
                return 2
            continue
        sub = commands.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub)
        modules[name] = module
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args) or 0)
