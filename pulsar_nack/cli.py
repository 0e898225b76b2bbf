"""``pulsar-nack``: the command line (``demo`` and ``bench``).

Each subcommand lives in its own module and contributes ``add_arguments(parser)`` and
``run(args) -> int``; this module only wires them to argparse, importing them on use.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

__all__ = ["main"]

# subcommand -> (module, one-line help)
_COMMANDS = {
    "demo": ("pulsar_nack.demo", "run the Spark pipeline on the embedded broker and print a summary"),
    "bench": ("bench.cli", "run the benchmarks (tracker vs hash-map baseline vs built-in client)"),
}


def _add_checkout_to_path() -> None:
    """Make the checkout's top-level ``bench/`` importable (it is not in the wheel)."""
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "bench" / "__init__.py").is_file() and str(checkout) not in sys.path:
        sys.path.append(str(checkout))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pulsar-nack`` script; returns the exit code."""
    _add_checkout_to_path()
    parser = argparse.ArgumentParser(prog="pulsar-nack", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {}
    for name, (module_name, help_text) in _COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:  # e.g. bench/ is not shipped in the wheel
            sub.set_defaults(_missing=f"{name} is unavailable: {error}")
            continue
        module.add_arguments(sub)
        modules[name] = module
    args = parser.parse_args(argv)
    missing = getattr(args, "_missing", None)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
