"""A small client of Apache Pulsar's admin REST API (``/admin/v2``), for tests and benchmarks.

Only what the tests need: namespaces, partitioned topics, topic and subscription stats.
Topic names may be short (``orders``) or full (``persistent://public/default/orders``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from .._validate import check_int
from ..core.keys import split_topic
from ..errors import BrokerError

__all__ = ["PulsarAdmin", "topic_path"]

_TIMEOUT_S = 30.0


def topic_path(topic: str) -> str:
    """``persistent/public/default/orders`` for ``orders`` or its full name (:func:`~pulsar_nack.core.keys.split_topic`)."""
    return "/".join(split_topic(topic))


class PulsarAdmin:
    """Calls on ``http://127.0.0.1:PORT/admin/v2``; errors become :class:`BrokerError`."""

    def __init__(self, admin_url: str) -> None:
        if not isinstance(admin_url, str) or not admin_url.startswith("http"):
            raise ValueError(f"admin_url must be an http URL, got {admin_url!r}")
        self.admin_url = admin_url.rstrip("/")

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One REST call; the decoded JSON answer, or None for an empty one."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.admin_url}/admin/v2/{path}", data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=_TIMEOUT_S) as answer:
                text = answer.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise BrokerError(f"{method} {path}: HTTP {exc.code} {detail}") from None
        return json.loads(text) if text.strip() else None

    def namespaces(self, tenant: str) -> list[str]:
        return list(self.request("GET", f"namespaces/{tenant}"))

    def create_partitioned_topic(self, topic: str, partitions: int) -> str:
        """Create *topic* with *partitions* partitions (1-10,000); return its full name."""
        check_int("partitions", partitions, 1, 10_000)
        path = topic_path(topic)
        self.request("PUT", f"{path}/partitions", partitions)
        domain, rest = path.split("/", 1)
        return f"{domain}://{rest}"

    def topic_stats(self, topic: str) -> dict[str, Any]:
        """The topic's stats (``/stats``), or the partitioned stats of a partitioned topic."""
        path = topic_path(topic)
        meta = self.request("GET", f"{path}/partitions")
        if meta and meta.get("partitions", 0) > 0:
            return dict(self.request("GET", f"{path}/partitioned-stats"))
        return dict(self.request("GET", f"{path}/stats"))

    def backlog(self, topic: str, subscription: str) -> int:
        """Messages not yet acknowledged on *subscription* (``msgBacklog``)."""
        subs = self.topic_stats(topic).get("subscriptions", {})
        if subscription not in subs:
            raise BrokerError(f"no subscription {subscription!r} on {topic}")
        return int(subs[subscription]["msgBacklog"])
