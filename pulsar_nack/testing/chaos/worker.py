"""Entry point of a chaos run's worker processes: ``python -m pulsar_nack.testing.chaos.worker SPEC ROLE NAME``.

*SPEC* is the run's :class:`~pulsar_nack.testing.chaos.workload.WorkloadSpec` (JSON),
*ROLE* one of ``consumer``, ``producer``, ``dead-letters``, *NAME* the process's name in it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .consumer import run_consumer
from .dead_letters import run_dead_letter_reader
from .producer import run_producer
from .workload import WorkloadSpec

__all__ = ["ROLES", "main"]

ROLES = {"consumer": run_consumer, "producer": run_producer, "dead-letters": run_dead_letter_reader}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3 or args[1] not in ROLES:
        print(f"usage: python -m pulsar_nack.testing.chaos.worker SPEC {{{','.join(ROLES)}}} NAME", file=sys.stderr)
        return 2
    spec_path, role, name = args
    ROLES[role](WorkloadSpec.load(spec_path), name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
