"""Every Python-level and binding call per message on a consumer's hot paths: a cProfile count.

For ``bench/consumer.py``'s cases where ``NackingConsumer`` pays most over the plain
consumer (issue 36), it runs each case's timed loop once under :mod:`cProfile` on a real
consumer (Apache Pulsar standalone) and reports, per function, the calls per message and
the profiled time per message (cProfile's own overhead inflates the time; the call counts
are exact). The cases:

* ``guarding_batched`` / ``guarding_unbatched``: ``acknowledge(receive())`` on a consumer
  that guards all the time (``always_guard=True``), batches of 10 or not;
* ``nack_message``: ``negative_acknowledge(message)`` on received non-batched messages;
* ``working_10pct_batched`` / ``working_10pct_unbatched``: receive, then nack every 10th
  message (one hour) and ack the rest;
* ``plain_receive_ack_unbatched`` and ``plain_nack_message``: the plain ``pulsar.Consumer``
  on the same loops, for comparison;
* ``ack_timeout_batched`` / ``ack_timeout_unbatched`` and their ``plain_`` twins:
  ``acknowledge(receive())``, batches of 10 or not, with ``unacked_messages_timeout_ms`` (ten minutes), ours
  beside the plain consumer with its own ack timeout.

cProfile sees the calls made from Python code: our functions, the client's bindings
(``_pulsar``) and our C extensions' methods, but not a C function called through
``functools.partial`` (the ack timeout's ``received(message)`` and ``settled(message)``,
``msgid.log_received`` and ``msgid.settle_logged``: one call per receive and one per
acknowledgement, missing from the counts). Calls a C extension makes itself are not
seen; :data:`C_CALLS` lists them by extension method, and the summary adds them to the
binding count (an upper bound for ``received_key``, which reads the id only when the
message kept none: then ``topic_name()`` is its one call). With native id reads
(pulsar-client 3.9+, ``pulsar_nack.consumer.native_ids``) those methods call libpulsar
instead, and only :data:`NATIVE_C_CALLS` are counted.

Run ``python -m bench.profile_consumer [--messages 20000] [--out NAME] [--cases A,B]``; writes
``bench/results/consumer-profile.json`` (or ``NAME.json``). ``--url``/``--admin-url`` use a
running broker instead of starting one.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from collections.abc import Callable
from typing import Any

from ._common import print_table, start_context, write_result
from .consumer import _close
from .consumer import backlog_consumer as _backlog

C_CALLS = {
    "admit": ("message_id", "serialize"),
    "admit_message": ("message_id", "serialize"),
    "message_key": ("message_id", "serialize", "topic_name"),
    "read_id": ("message_id", "serialize"),
    "received_key": ("message_id", "serialize", "topic_name"),
    "receive": ("receive", "message_id", "serialize"),  # Gate: the client's receive, and admit_message's read
    "acknowledge": ("acknowledge",),  # Gate: the client's acknowledge
}
"""Calls into the client's bindings that our C extension methods make themselves (not seen by cProfile)."""
NATIVE_C_CALLS = {
    "admit": C_CALLS["admit"], "read_id": C_CALLS["read_id"], "receive": ("receive",), "acknowledge": ("acknowledge",),
}
"""The same with native id reads on (``msgid.NATIVE_IDS``): the others read through libpulsar, not the bindings
(but for a chunked message, which no case here receives)."""


def c_calls() -> dict[str, tuple[str, ...]]:
    """:data:`C_CALLS` or :data:`NATIVE_C_CALLS`, as this process reads ids."""
    from pulsar_nack.consumer import msgid

    return NATIVE_C_CALLS if msgid.NATIVE_IDS else C_CALLS

CASES = (
    "guarding_batched", "guarding_unbatched", "nack_message", "working_10pct_batched", "working_10pct_unbatched",
    "plain_receive_ack_unbatched", "plain_nack_message", "ack_timeout_batched", "ack_timeout_unbatched",
    "plain_ack_timeout_batched", "plain_ack_timeout_unbatched",
)  # fmt: skip


def _label(key: tuple[str, int, str]) -> str:
    """A readable name for a pstats key: ``module.py:function`` or ``{built-in method}``."""
    path, line, name = key
    if path == "~":
        return name
    return f"{path.rsplit('/', 2)[-2]}/{path.rsplit('/', 1)[-1]}:{line}:{name}"


def _is_binding(label: str) -> bool:
    return "_pulsar." in label or "of '_pulsar" in label


def _extension_method(label: str) -> str | None:
    """The name of our C extension's method in a built-in's label (``<method 'admit' of ...EntryTable...>``)."""
    if "_msgid" not in label and "_speedups" not in label:
        return None
    if "'" in label:  # <method 'admit' of '..._msgid.EntryTable' objects>
        return label.split("'")[1]
    return label.rstrip(">").rsplit(".", 1)[-1]  # <built-in method pulsar_nack.consumer._msgid.message_key>


def profile_loop(loop: Callable[[], int]) -> dict[str, Any]:
    """Run *loop* (which returns its message count) under cProfile; calls and µs per message by function."""
    profiler = cProfile.Profile()
    profiler.enable()
    count = loop()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = []
    for key, (_cc, calls, own, _cumulative, _callers) in stats.items():
        label = _label(key)
        if label.startswith("<method 'disable' of '_lsprof"):
            continue
        rows.append({"function": label, "calls_per_message": calls / count, "own_us_per_message": own / count * 1e6})
    rows.sort(key=lambda r: (-r["calls_per_message"], r["function"]))
    python_calls = sum(r["calls_per_message"] for r in rows if not r["function"].startswith("<"))
    builtin_calls = sum(r["calls_per_message"] for r in rows if r["function"].startswith("<"))
    binding_calls = sum(r["calls_per_message"] for r in rows if _is_binding(r["function"]))
    hidden = 0.0
    inside = c_calls()
    for r in rows:
        method = _extension_method(r["function"])
        if method in inside:
            hidden += r["calls_per_message"] * len(inside[method])
    return {
        "messages": count,
        "python_calls_per_message": python_calls,
        "builtin_calls_per_message": builtin_calls,
        "binding_calls_per_message": binding_calls + hidden,
        "binding_calls_inside_our_c_per_message": hidden,
        "profiled_us_per_message": sum(r["own_us_per_message"] for r in rows),
        "functions": rows,
    }


def _receive_ack_system(case: str) -> str:
    """The system a receive + acknowledge case profiles (see :func:`bench.consumer._subscribe`)."""
    suffix = "-ack-timeout" if "ack_timeout" in case else ""
    if case.startswith("plain"):
        return f"plain{suffix}"
    return f"pulsar-nack{suffix}" if suffix else "pulsar-nack-guarding"


def run_case(client: Any, admin: Any, case: str, n: int) -> dict[str, Any]:
    """Profile one case's loop on a fresh topic and consumer."""
    if case.startswith(("guarding", "plain_receive", "ack_timeout", "plain_ack_timeout")):
        consumer = _backlog(client, admin, _receive_ack_system(case), n, case.endswith("_batched"), "prof")
        receive, acknowledge = consumer.receive, consumer.acknowledge

        def loop() -> int:
            for _ in range(n - 1):
                acknowledge(receive(30_000))
            return n - 1

    elif case.endswith("nack_message"):
        consumer = _backlog(client, admin, "plain" if case.startswith("plain") else "pulsar-nack", n, False, "prof")
        messages = [consumer.receive(30_000) for _ in range(n - 1)]
        nack = consumer.negative_acknowledge

        def loop() -> int:
            for message in messages:
                nack(message)
            return len(messages)

    else:
        consumer = _backlog(client, admin, "pulsar-nack", n, case.endswith("_batched"), "prof")
        receive, acknowledge, nack = consumer.receive, consumer.acknowledge, consumer.negative_acknowledge

        def loop() -> int:
            for i in range(n - 1):
                message = receive(30_000)
                if i % 10 == 0:
                    nack(message)
                else:
                    acknowledge(message)
            return n - 1

    try:
        return profile_loop(loop)
    finally:
        _close(consumer)


def run(url: str, admin: Any, n: int, broker: str, cases_run: tuple[str, ...] = CASES) -> dict[str, Any]:
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        cases = {case: run_case(client, admin, case, n) for case in cases_run}
    finally:
        client.close()
    from pulsar_nack.consumer import msgid

    return {"broker": broker, "messages": n, "native_ids": msgid.NATIVE_IDS,
            "c_calls": {k: list(v) for k, v in c_calls().items()}, "cases": cases}  # fmt: skip


def _report(payload: dict[str, Any], top: int = 12) -> None:
    for case, result in payload["cases"].items():
        print(
            f"\n{case}: {result['python_calls_per_message']:.2f} Python-level calls, "
            f"{result['binding_calls_per_message']:.2f} binding calls "
            f"({result['binding_calls_inside_our_c_per_message']:.2f} inside our C), "
            f"{result['builtin_calls_per_message']:.2f} built-in calls per message"
        )
        print_table(
            ["function", "calls/msg", "own µs/msg (profiled)"],
            [[r["function"][:90], f"{r['calls_per_message']:.3f}", f"{r['own_us_per_message']:.2f}"]
             for r in result["functions"][:top]],
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_consumer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--url", default=None, help="a running broker's service URL (else one is started)")
    parser.add_argument("--admin-url", default=None)
    parser.add_argument("--label", default="Apache Pulsar standalone (running)", help="the running broker, for the JSON")
    parser.add_argument("--out", default="consumer-profile")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated cases to run (default: all)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    cases = tuple(args.cases.split(","))
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s): {', '.join(unknown)}")
    start = start_context()
    if args.url:
        from pulsar_nack.testing.admin import PulsarAdmin

        payload = run(args.url, PulsarAdmin(args.admin_url), args.messages, args.label, cases)
    else:
        from pulsar_nack.testing import PulsarStandalone

        with PulsarStandalone(batch_index_ack=True) as broker:
            label = f"Apache Pulsar {broker.version} standalone, batch-index acks on"
            payload = run(broker.url, broker.admin, args.messages, label, cases)
    _report(payload)
    path = write_result(args.out, payload, start)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
