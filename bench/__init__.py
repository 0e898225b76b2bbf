"""Benchmarks of pulsar-nack: memory (the PIP-393 grid) and core performance.

Run from the repository root with the package importable, e.g.::

    PYTHONPATH=. python -m bench.memory --quick
    PYTHONPATH=. python -m bench.core_perf --quick

Full runs write ``bench/results/<name>.json`` (committed); ``--quick`` runs write
``<name>-quick.json``.
"""
