"""The build's one piece pyproject.toml cannot declare: the admission ledger compiled by mypyc.

pyproject.toml declares the project and its two C extensions; setuptools adds them to the
extensions listed here. The ledger (:mod:`pulsar_nack.consumer.admission` and the modules it
keeps its state in) is ordinary typed Python that mypyc compiles into C extensions: the same
code, less interpreter work on every retry. Like the C extensions, it is optional: where no
C compiler (or no mypyc) is found, the modules stay pure Python and behave the same.
"""

from __future__ import annotations

import sys

from setuptools import setup

LEDGER = (
    "pulsar_nack/consumer/admission.py",
    "pulsar_nack/consumer/entry_handoff.py",
    "pulsar_nack/consumer/message_sets.py",
)
"""The modules compiled together (one shared library, ``pulsar_nack.consumer._ledger__mypyc``)."""


def compiled_ledger() -> list:
    """The ledger's extensions, each optional; none where mypyc is missing (a build without isolation) or fails."""
    try:
        from mypyc.build import mypycify
    except ImportError:
        return []
    try:
        # The build runs without the project's dependencies (pyroaring...): an ignore needed with them is unused here.
        options = ["--no-warn-unused-ignores"]
        extensions = mypycify([*options, *LEDGER], group_name="pulsar_nack.consumer._ledger", opt_level="3")
    except (Exception, SystemExit) as error:  # mypyc exits on a type error: the build goes on in pure Python
        print(f"setup.py: the ledger stays pure Python, mypyc failed: {error!r}", file=sys.stderr)
        return []
    for extension in extensions:
        extension.optional = True  # no C compiler: pure Python, as for the C extensions
    return extensions


setup(ext_modules=compiled_ledger())
