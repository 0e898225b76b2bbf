"""Chaos and soak runs: a seeded nemesis against a recorded workload, checked from the history.

- :mod:`.workload`: the topics, subscriptions and processes of a run (:class:`WorkloadSpec`);
- :mod:`.fate`: a message's payload and its seeded fate (acked after k failures, or poison);
- :mod:`.history`: append-only JSON-lines files, one per process, that survive a SIGKILL;
- :mod:`.consumer`, :mod:`.producer`, :mod:`.dead_letters`: the worker processes
  (:mod:`.worker` is their entry point), :mod:`.fleet` starts and kills them;
- :mod:`.nemesis`: the faults; :mod:`.run`: one run from start to drain;
- :mod:`.checker`: the promises, checked on a history; :mod:`.soak`: memory over time.

``python -m bench.chaos`` runs them (see docs/benchmarks.md).
"""

from __future__ import annotations

__all__: list[str] = []
