"""A chaos message: its payload (a unique id and the produce time) and its fate, drawn from the seed.

The fate of a message is a pure function of the run's seed and the message's id, so that
every consumer process, and every incarnation of one, treats a message the same way, and
a run can be replayed from its seed. A fate says how the message is retried (a nack, or a
durable ``reconsume_later``) and how many deliveries fail before one is acknowledged; a
*poison* message always fails and ends in the dead-letter topic.

>>> fate = fate_of(7, "p-1-42", (Mechanism.NACK, Mechanism.RECONSUME))
>>> fate == fate_of(7, "p-1-42", (Mechanism.NACK, Mechanism.RECONSUME))
True
>>> decode(encode("p-1-42", 12.5))
('p-1-42', 12.5)
"""

from __future__ import annotations

import enum
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["NACK_DELAYS_MS", "POISON", "RECONSUME_DELAYS_MS", "Fate", "Mechanism", "decode", "encode", "fate_of"]

POISON = -1
"""``Fate.failures`` of a message that never succeeds."""
NACK_DELAYS_MS = (100, 300, 700, 1_500, 3_000)
RECONSUME_DELAYS_MS = (200, 600, 1_200, 2_500, 5_000)
_FAILURES = ((0, 50), (1, 25), (2, 17), (POISON, 8))
"""(failures, weight): half the messages are acked at once, 8 % are poison."""


class Mechanism(str, enum.Enum):
    """How a failed delivery is retried."""

    NACK = "nack"
    """``negative_acknowledge``, with a per-call delay or the consumer's backoff."""
    RECONSUME = "reconsume"
    """``reconsume_later`` with a per-call delay."""


@dataclass(frozen=True)
class Fate:
    """What the consumers do with one message.

    Attributes
    ----------
    mechanism : Mechanism
    failures : int
        Deliveries that fail (by ``redelivery_count()``) before one is acked; :data:`POISON`
        for never.
    by_backoff : bool
        A nack leaves the delay to the consumer's ``redelivery_backoff``.
    delays_ms : tuple of int
        The per-call delay of each failed attempt (cycled).
    """

    mechanism: Mechanism
    failures: int
    by_backoff: bool
    delays_ms: tuple[int, ...]

    def fails(self, attempt: int) -> bool:
        """Whether the delivery with ``redelivery_count() == attempt`` fails."""
        return self.failures == POISON or attempt < self.failures

    def delay_ms(self, attempt: int) -> int:
        """The per-call delay of the failed delivery *attempt*."""
        return self.delays_ms[attempt % len(self.delays_ms)]


def fate_of(seed: int, message_id: str, mechanisms: Sequence[Mechanism]) -> Fate:
    """The fate of *message_id* in a run seeded with *seed*, among the subscription's *mechanisms*."""
    rng = random.Random(f"{seed}:{message_id}")
    mechanism = mechanisms[rng.randrange(len(mechanisms))]
    failures = rng.choices([f for f, _ in _FAILURES], [w for _, w in _FAILURES])[0]
    pool = NACK_DELAYS_MS if mechanism is Mechanism.NACK else RECONSUME_DELAYS_MS
    delays = tuple(rng.choice(pool) for _ in range(4))
    return Fate(mechanism, failures, mechanism is Mechanism.NACK and rng.random() < 0.5, delays)


def encode(message_id: str, produced: float) -> bytes:
    """The payload of a chaos message."""
    return json.dumps({"id": message_id, "t": produced}, separators=(",", ":")).encode()


def decode(payload: bytes) -> tuple[str, float]:
    """``(id, produce time)`` of a chaos payload."""
    body = json.loads(payload)
    return str(body["id"]), float(body["t"])
