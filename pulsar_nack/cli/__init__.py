"""``pulsar-nack``: the command line (``demo``, ``broker`` and ``bench``).

Each subcommand lives in its own module and contributes ``add_arguments(parser)`` and
``run(args) -> int``; this module only wires them to argparse, importing them on use.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from .. import __version__

__all__ = ["main"]

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
    """Entry point of the ``pulsar-nack`` script; returns the exit code."""
    parser = _PlainHelpParser(prog="pulsar-nack", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_PlainHelpParser)
    modules = {}
    for name, (module_name, help_text) in _COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        try:
            module = _import_command(module_name)
        except ImportError as error:  # bench/ is not in the wheel: run from a checkout
            sub.set_defaults(_missing=_unavailable(name, error))
            continue
        module.add_arguments(sub)
        modules[name] = module
    args, unknown = parser.parse_known_args(argv)  # an unavailable command takes any arguments
    missing = getattr(args, "_missing", None)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return int(modules[args.command].run(args) or 0)
