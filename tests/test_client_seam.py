"""The seam to pulsar-client's private surface (pulsar_nack/consumer/_client.py, issue 24).

One module touches private names of ``pulsar`` and ``_pulsar``; it checks at import that
the installed client has them, and an unsupported client gets a clear
:class:`~pulsar_nack.errors.UnsupportedClientError`. ``tools/client_matrix.py`` runs
this file (with the consumer tests) on the oldest and the newest supported client.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import re
import subprocess
import sys
import tokenize
import types
import uuid
from pathlib import Path
from typing import Any

import _pulsar
import pulsar
import pytest

import pulsar_nack
from pulsar_nack.consumer import _client
from pulsar_nack.errors import PulsarNackError, UnsupportedClientError

PACKAGE = Path(pulsar_nack.__file__).parent
SEAM = PACKAGE / "consumer" / "_client.py"
ROOT = PACKAGE.parent

# ---------------------------------------------------------------- one seam


def _pulsar_private_names() -> set[str]:
    """Every ``_name`` in the installed pulsar package's Python sources (attributes, helpers)."""
    spec = importlib.util.find_spec("pulsar")
    assert spec is not None and spec.submodule_search_locations
    names = {"_message", "_msg_id", "_consumer", "_schema", "_client", "_producer", "_reader"}
    for path in Path(next(iter(spec.submodule_search_locations))).rglob("*.py"):
        with path.open("rb") as source:
            for token in tokenize.tokenize(source.readline):
                if token.type == tokenize.NAME and re.fullmatch(r"_[a-z]\w*", token.string):
                    names.add(token.string)
    return names


def _private_accesses(path: Path, private: set[str], root: Path = ROOT) -> list[str]:
    """Where *path*'s code (not its docstrings) uses ``_pulsar`` or a private name of pulsar's."""
    found = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "_pulsar" for a in node.names):
            what = "import _pulsar"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "_pulsar":
            what = "from _pulsar import"
        elif isinstance(node, ast.Name) and node.id == "_pulsar":
            what = "_pulsar"
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("pulsar", "pulsar_asyncio"):
                what = f"{owner.id}.{node.attr}"
            elif node.attr in private and not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                what = f".{node.attr}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in private
        ):
            what = f"{node.func.id}(..., {node.args[1].value!r})"
        if what:
            found.append(f"{path.relative_to(root)}:{getattr(node, 'lineno', '?')}: {what}")
    return found


SCANNED = [PACKAGE, ROOT / "bench", ROOT / "examples", ROOT / "tools"]
"""What the seam checks cover: the package, and the benchmarks, examples and tools shipped beside it."""


def _scanned_files() -> list[Path]:
    return [path for top in SCANNED for path in sorted(top.rglob("*.py")) if path != SEAM]


def test_only_the_seam_touches_private_names_of_pulsar():
    private = _pulsar_private_names()
    found = [hit for path in _scanned_files() for hit in _private_accesses(path, private)]
    assert not found, "private pulsar-client names outside consumer/_client.py:\n" + "\n".join(found)


GREP = re.compile(r"\._message\b|\._consumer\b|_msg_id|\._schema|import _pulsar|from _pulsar|\._client\b")
"""The issue's grep, as a reviewer runs it (``grep -rnE`` on the package, bench and examples)."""
OUR_SEAM_IMPORT = re.compile(r"^\s*from (\.+|pulsar_nack\.)(consumer\.)?_client import |^\s*from (\.+|pulsar_nack\.)consumer import _client\b")
"""Importing the seam module itself (named ``_client``) is not a reach into pulsar-client."""


def _code_lines(path: Path) -> list[str]:
    """*path*'s lines with strings and comments blanked out (docstrings may name what the code may not)."""
    lines = [list(line) for line in path.read_text().splitlines()]
    with path.open("rb") as source:
        for token in tokenize.tokenize(source.readline):
            if token.type in (tokenize.STRING, tokenize.COMMENT):
                (row, col), (end_row, end_col) = token.start, token.end
                for r in range(row, end_row + 1):
                    start = col if r == row else 0
                    stop = end_col if r == end_row else len(lines[r - 1])
                    lines[r - 1][start:stop] = " " * (stop - start)
    return ["".join(line) for line in lines]


def _grep_hits(path: Path, root: Path = ROOT) -> list[str]:
    return [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for number, line in enumerate(_code_lines(path), 1)
        if GREP.search(line) and not OUR_SEAM_IMPORT.search(line)
    ]


def test_the_plain_grep_finds_nothing_outside_the_seam():
    """The issue's ``grep -rnE`` finds nothing in code outside the seam: our own attributes
    are named apart from pulsar-client's (``_plain``, ``_native``, ``_value_schema``), so
    every hit of the grep is a real reach into the client."""
    found = [hit for path in _scanned_files() for hit in _grep_hits(path)]
    assert not found, "pulsar-client private names outside consumer/_client.py:\n" + "\n".join(found)


def test_the_plain_grep_is_not_blind(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from ._client import raw_id\n"
        "from pulsar_nack.consumer import _client as seam\n"
        '"""._message in a docstring does not count"""\n'
        "inner = message._message  # ._consumer in a comment does not count\n"
        "self._consumer = consumer\n"
        "import _pulsar\n"
    )
    assert [hit.split(":")[1] for hit in _grep_hits(sample, tmp_path)] == ["4", "5", "6"]


def test_the_grep_finds_what_it_looks_for(tmp_path):
    """The check above is not blind: each kind of access in a sample is found, docstrings are not."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import _pulsar\nimport pulsar\n"
        "def f(self, message, consumer, mid):\n"
        '    """._message in a docstring does not count"""\n'
        "    self._consumer = consumer\n"
        "    consumer._consumer.receive()\n"
        "    getattr(mid, '_msg_id', None)\n"
        "    pulsar._check_type(int, 1, 'x')\n"
        "    return message._message\n"
    )
    found = [line.rsplit(": ", 1)[1] for line in _private_accesses(sample, _pulsar_private_names(), tmp_path)]
    assert sorted(found) == sorted(["import _pulsar", "._consumer", "getattr(..., '_msg_id')", "pulsar._check_type", "._message"])


# ---------------------------------------------------------------- the version check


def _stand_in(name: str, **members: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in members.items():
        setattr(module, key, value)
    return module


def test_a_client_without_the_names_gets_a_clear_error():
    """Stand-in modules: only real pulsar-client releases can be installed, and the
    installed one has every name, so a release that lacks them is played by an empty
    ``types.ModuleType`` (and one that lacks a single method, below)."""
    with pytest.raises(UnsupportedClientError) as info:
        _client.check_client(_stand_in("pulsar"), _stand_in("_pulsar"), "3.99.0")
    message = str(info.value)
    assert "pulsar-client 3.99.0 is not supported" in message
    assert f">=3.9.0,<{_client.NEXT_MAJOR}" in message and "missing: _pulsar.Message, _pulsar.MessageId" in message
    assert isinstance(info.value, PulsarNackError) and isinstance(info.value, ImportError)
    with pytest.raises(UnsupportedClientError, match=r"missing: _pulsar\)"):
        _client.check_client(pulsar, None, "3.99.0")  # no _pulsar module at all


def test_a_client_without_the_handoff_ids_topic_setter_gets_a_clear_error():
    """Stand-in ``_pulsar`` whose ``MessageId`` has no ``topic_name`` setter, as before 3.8.0
    (a real 3.7.0 cannot be installed beside the real client this test runs on)."""

    class MessageIdBefore38:
        def __init__(self, partition: int, ledger: int, entry: int, batch: int) -> None:
            pass

        ledger_id = entry_id = batch_index = partition = serialize = lambda self: 0

    real = {name: getattr(_pulsar, name) for name in dir(_pulsar) if not name.startswith("__")}
    raw = _stand_in("_pulsar", **{**real, "MessageId": MessageIdBefore38})
    with pytest.raises(UnsupportedClientError, match=r"pulsar-client 3\.7\.0 .*missing: _pulsar\.MessageId\.topic_name\)"):
        _client.check_client(pulsar, raw, "3.7.0")

    class SetterRefusesStr(MessageIdBefore38):
        def topic_name(self) -> str:  # a getter only: the probe's call with a topic fails
            return ""

    raw.MessageId = SetterRefusesStr
    with pytest.raises(UnsupportedClientError, match=r"topic_name\(str\)"):
        _client.check_client(pulsar, raw, "3.7.0")


def test_a_client_without_the_dead_letter_calls_gets_a_clear_error():
    """Stand-in ``_pulsar`` as in 3.8.0: its consumer has no ``acknowledge_async`` or
    ``close_async`` and its client no ``subscribe_async``, which the dead-letter path uses."""
    real = {name: getattr(_pulsar, name) for name in dir(_pulsar) if not name.startswith("__")}
    consumer = types.new_class("Consumer", (), {}, lambda ns: ns.update(
        {n: getattr(_pulsar.Consumer, n) for n in ("receive", "acknowledge", "negative_acknowledge", "is_connected",
                                                  "redeliver_unacknowledged_messages", "get_last_message_id",
                                                  "unsubscribe", "close", "pause_message_listener", "resume_message_listener")}
    ))
    client = types.new_class(
        "Client", (), {}, lambda ns: ns.update(dict.fromkeys(("create_producer_async", "subscribe", "get_topic_partitions")))
    )
    raw = _stand_in("_pulsar", **{**real, "Consumer": consumer, "Client": client})
    expected = r"pulsar-client 3\.8\.0 .*>=3\.9\.0,<4 \(missing: _pulsar\.Consumer\.acknowledge_async, _pulsar\.Consumer\.close_async, _pulsar\.Client\.subscribe_async\)"
    with pytest.raises(UnsupportedClientError, match=expected):
        _client.check_client(pulsar, raw, "3.8.0")


def test_the_installed_client_passes_and_a_new_major_is_warned_about():
    assert _client.missing_names(pulsar, _pulsar) == []
    _client.check_client(pulsar, _pulsar, _client.client_version())
    with pytest.warns(RuntimeWarning, match=r"pulsar-client 4\.0\.0 is outside the range"):
        _client.check_client(pulsar, _pulsar, "4.0.0")


class _AsyncConsumer39:
    """pulsar.asyncio.Consumer as in 3.9.0: no get_last_message_id, no redeliver_unacknowledged_messages."""

    def __init__(self, consumer: Any, schema: Any) -> None:
        self._consumer = consumer
        self._schema = schema

    async def receive(self) -> pulsar.Message:
        message = pulsar.Message()
        message._message = await self._consumer.receive_async()
        return message


for _name in ("acknowledge", "acknowledge_cumulative", "seek", "unsubscribe", "close", "topic",
              "subscription_name", "consumer_name"):  # fmt: skip
    setattr(_AsyncConsumer39, _name, lambda self: None)


class _AsyncClient:
    def __init__(self, service_url: str) -> None:
        self._client = service_url

    async def subscribe(self, topic: str, subscription_name: str) -> None: ...


def test_the_asyncio_door_needs_the_asyncio_consumer():
    """Stand-in ``pulsar.asyncio`` modules (only one real client can be installed here): as in
    pulsar-client 3.5-3.8 (no Consumer: refused), 3.9 (a Consumer without ``get_last_message_id``
    and ``redeliver_unacknowledged_messages``: accepted, the seam does those on the raw
    consumer), one without ``seek`` (refused) and 3.1-3.4 (no module: refused)."""

    def importer_of(module: types.ModuleType) -> Any:
        return lambda name: module

    before_39 = _stand_in("pulsar.asyncio", Client=_AsyncClient)
    with pytest.raises(UnsupportedClientError, match=r"pulsar-client 3\.8\.0 .*>=3\.9\.0,<4.*missing: pulsar\.asyncio\.Consumer\)"):
        _client.load_asyncio("3.8.0", importer_of(before_39))
    in_39 = _stand_in("pulsar.asyncio", Client=_AsyncClient, Consumer=_AsyncConsumer39)
    assert _client.load_asyncio("3.9.0", importer_of(in_39)) is in_39
    no_seek = type("Consumer", (), {n: v for n, v in vars(_AsyncConsumer39).items() if n != "seek"})
    with pytest.raises(UnsupportedClientError, match=r"missing: pulsar\.asyncio\.Consumer\.seek\)"):
        _client.load_asyncio("3.99.0", importer_of(_stand_in("pulsar.asyncio", Client=_AsyncClient, Consumer=no_seek)))

    def no_module(name: str) -> types.ModuleType:
        raise ModuleNotFoundError(name)

    with pytest.raises(UnsupportedClientError, match=r"pulsar-client 3\.4\.0 .*missing: pulsar\.asyncio\)"):
        _client.load_asyncio("3.4.0", no_module)


def test_importing_the_asyncio_door_on_this_client():
    """On the real installed client (the matrix runs this on each version): the door opens."""
    result = subprocess.run([sys.executable, "-c", "import pulsar_nack.asyncio"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_a_real_consumer_without_its_inner_consumer_is_refused():
    bare = object.__new__(pulsar.Consumer)  # what a client that builds consumers differently would return
    with pytest.raises(UnsupportedClientError, match=r"missing: pulsar\.Consumer\._consumer"):
        _client.raw_consumer(bare)

    class StandIn(pulsar.Consumer):
        def __init__(self) -> None:
            pass

    assert _client.raw_consumer(StandIn()) is None  # unit tests' stand-ins keep working


def test_pyproject_declares_the_range_the_seam_checks():
    text = (ROOT / "pyproject.toml").read_text()
    assert f'"pulsar-client{_client.SUPPORTED}"' in text
    assert _client.SUPPORTED == ">=3.9.0,<4"


# ---------------------------------------------------------------- on a broker


@pytest.mark.broker
def test_the_asyncio_calls_pulsar_asyncio_lacks_before_3_10_work(apache_broker):
    """``get_last_message_id`` and ``redeliver_unacknowledged_messages`` of the asyncio consumer:
    pulsar.asyncio has them from 3.10.0; on 3.9.0 the seam does them on the raw consumer."""
    asyncio.run(_async_surface(apache_broker.url))


async def _async_surface(url: str) -> None:
    import pulsar.asyncio

    import pulsar_nack.asyncio

    topic = f"persistent://public/default/seam-{uuid.uuid4().hex[:10]}"
    client = pulsar.asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        consumer = await pulsar_nack.asyncio.subscribe(
            client, topic, "s", consumer_type=pulsar.ConsumerType.Shared
        )
        producer = await client.create_producer(topic, batching_enabled=False)
        sent = await producer.send(b"x")
        first = await asyncio.wait_for(consumer.receive(), 30)
        last = await consumer.get_last_message_id()
        assert (last.ledger_id(), last.entry_id()) == (sent.ledger_id(), sent.entry_id())
        consumer.redeliver_unacknowledged_messages()
        again = await asyncio.wait_for(consumer.receive(), 30)
        assert again.data() == first.data() == b"x" and again.redelivery_count() >= 1
        await consumer.acknowledge(again)
        await consumer.close()
        await producer.close()
    finally:
        await client.close()
