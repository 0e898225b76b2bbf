"""Chunked messages: which entries a chunked message spans, read from its id.

A producer with chunking on (batching off) splits a payload larger than the broker's
``maxMessageSize`` into chunks, each an entry of its own; the consumer reassembles them
and gives the message the id of its *last* chunk, with the first chunk's id inside
(``(5,0,-1,-1);(5,2,-1,-1)`` as the client prints it: chunks at entries 0 to 2).
Redelivering the last chunk's entry alone, as an entry-level id does, brings back a
chunk the client cannot reassemble: the message never comes back. That is what
pulsar-client 3.13.0's own nack tracker does (its C++ client lacks apache/pulsar-client-cpp#604),
and what this library's handoff did. So a nacked chunked message's handoff names every
entry from its first chunk to its last (:func:`chunk_entries`).

The first chunk's id is field 7 (``first_chunk_message_id``, a nested ``MessageIdData``)
of the serialized id; :func:`~pulsar_nack.consumer.msgid.first_chunk` reads it. No Pulsar
import: ints in, ints out.
"""

from __future__ import annotations

__all__ = ["chunk_entries"]

MAX_SPAN = 100_000
"""The most entries one chunked message is taken to span (a wider range is a corrupt id:
only its first and last chunk are named)."""


def chunk_entries(first: tuple[int, int], last: tuple[int, int]) -> list[tuple[int, int]]:
    """The entries of a chunked message other than its last: ``first`` up to the entry before ``last``.

    Chunks in another ledger than the last (a ledger rolled over mid-message) cannot be
    listed: only the first chunk is named then. O(span).

    >>> chunk_entries((5, 0), (5, 3))
    [(5, 0), (5, 1), (5, 2)]
    >>> chunk_entries((4, 9), (5, 1))
    [(4, 9)]
    """
    if first[0] != last[0] or not 0 <= last[1] - first[1] <= MAX_SPAN:
        return [first] if first != last else []
    return [(last[0], entry) for entry in range(first[1], last[1])]
