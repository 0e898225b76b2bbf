"""A small client of Apache Pulsar's admin REST API (``/admin/v2``), for tests and benchmarks.

Only what the tests need: namespaces, partitioned topics, topic and subscription stats,
topic lookups, unloading topics, bundles and namespaces (to move them between brokers),
and the broker's version and runtime configuration.
Topic names may be short (``orders``) or full (``persistent://public/default/orders``);
namespaces are ``tenant/namespace``.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from .._validate import check_int
from ..core.keys import split_topic
from ..errors import BrokerError

__all__ = ["PulsarAdmin", "namespace_path", "topic_path"]

_TIMEOUT_S = 30.0
_MAX_REDIRECTS = 3
_TRANSIENT_TRIES = 3
_TRANSIENT_PAUSE_S = 0.2


def topic_path(topic: str) -> str:
    """``persistent/public/default/orders`` for ``orders`` or its full name (:func:`~pulsar_nack.core.keys.split_topic`)."""
    return "/".join(split_topic(topic))


def namespace_path(namespace: str) -> str:
    """``public/default`` for ``public/default``; anything else than ``tenant/namespace`` is refused."""
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, got {type(namespace).__name__}")
    parts = namespace.split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"namespace must look like 'tenant/namespace', got {namespace!r}")
    return namespace


def _check_bundle(bundle: str) -> str:
    if not isinstance(bundle, str):
        raise TypeError(f"bundle must be a str, got {type(bundle).__name__}")
    low, sep, high = bundle.partition("_")
    if not (sep and low.startswith("0x") and high.startswith("0x")):
        raise ValueError(f"bundle must look like '0x00000000_0x40000000', got {bundle!r}")
    return bundle


class PulsarAdmin:
    """Calls on ``http://127.0.0.1:PORT/admin/v2``; errors become :class:`BrokerError`."""

    def __init__(self, admin_url: str) -> None:
        if not isinstance(admin_url, str) or not admin_url.startswith("http"):
            raise ValueError(f"admin_url must be an http URL, got {admin_url!r}")
        self.admin_url = admin_url.rstrip("/")

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One call on ``/admin/v2/{path}``; the decoded JSON answer, or None for an empty one."""
        return self._send(method, f"admin/v2/{path}", body)

    def _send(self, method: str, path: str, body: Any = None, *, text: bool = False) -> Any:
        """One call; follows a broker's 307 to the broker that owns the topic or bundle."""
        data = None if body is None else json.dumps(body).encode()
        url = f"{self.admin_url}/{path}"
        for _ in range(_MAX_REDIRECTS + 1):
            req = urllib.request.Request(url, data=data, method=method)
            req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=_TIMEOUT_S) as answer:
                    answer_text = answer.read().decode()
                break
            except urllib.error.HTTPError as exc:
                location = exc.headers.get("Location")
                if exc.code in (307, 308) and location:
                    url = location  # urllib follows no redirect of a PUT, POST or DELETE
                    continue
                detail = exc.read().decode(errors="replace")[:500]
                raise BrokerError(f"{method} {path}: HTTP {exc.code} {detail}") from None
        else:
            raise BrokerError(f"{method} {path}: more than {_MAX_REDIRECTS} redirects")
        if text:
            return answer_text.strip()
        return json.loads(answer_text) if answer_text.strip() else None

    def request_text(self, method: str, path: str, body: Any = None) -> str:
        """One call on ``/admin/v2/{path}``; the answer as text (some answers, like the version, are not JSON)."""
        return str(self._send(method, f"admin/v2/{path}", body, text=True))

    def namespaces(self, tenant: str) -> list[str]:
        return list(self.request("GET", f"namespaces/{tenant}"))

    def broker_version(self) -> str:
        """The Pulsar version the broker reports (``brokers/version``), e.g. ``"4.0.8"``."""
        return self.request_text("GET", "brokers/version").strip()

    def runtime_configuration(self) -> dict[str, str]:
        """Every broker setting as the broker runs with it (``brokers/configuration/runtime``), as strings."""
        return {str(key): str(value) for key, value in dict(self.request("GET", "brokers/configuration/runtime")).items()}

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

    # ------------------------------------------------------- where topics live

    def brokers(self, cluster: str) -> list[str]:
        """The active brokers of *cluster*, as ``host:web_port`` ids."""
        return list(self.request("GET", f"brokers/{cluster}"))

    def lookup(self, topic: str) -> dict[str, Any]:
        """Which broker serves *topic* (``brokerUrl``, ``httpUrl``); assigns it if nobody does.

        Asked again on HTTP 500, twice at most: a broker answers "Failed to acquire ownership for
        namespace bundle" while the bundle is being assigned (seen right after a bundle moved).
        """
        return dict(self._again_on_500(lambda: self._send("GET", f"lookup/v2/topic/{topic_path(topic)}")))

    def topic_bundle(self, topic: str) -> str:
        """The namespace bundle that holds *topic*, such as ``0x40000000_0x80000000``."""
        return str(self._send("GET", f"lookup/v2/topic/{topic_path(topic)}/bundle", text=True))

    def bundles(self, namespace: str) -> list[str]:
        """The bundles of *namespace*, in hash order."""
        boundaries = self.request("GET", f"namespaces/{namespace_path(namespace)}/bundles")["boundaries"]
        return [f"{low}_{high}" for low, high in itertools.pairwise(boundaries)]

    def unload_topic(self, topic: str) -> None:
        """Unload *topic* (every partition of a partitioned one); clients reconnect."""
        self._unload(f"{topic_path(topic)}/unload")

    def unload_namespace(self, namespace: str) -> None:
        """Unload every bundle of *namespace*; the load manager places them again on lookup."""
        self._unload(f"namespaces/{namespace_path(namespace)}/unload")

    def unload_bundle(self, namespace: str, bundle: str, destination_broker: str | None = None) -> None:
        """Unload one bundle; with *destination_broker* (a ``host:web_port`` id), place it there."""
        query = "" if destination_broker is None else f"?destinationBroker={destination_broker}"
        self._unload(f"namespaces/{namespace_path(namespace)}/{_check_bundle(bundle)}/unload{query}")

    def _unload(self, path: str) -> None:
        """One unload, asked again (twice at most) when the broker answers HTTP 500.

        An unload closes the topic's producers and consumers, the broker's own included; one that
        closes meanwhile fails the whole call ("Consumer already closed", seen on Apache Pulsar
        4.0.8 under load). Asking again unloads what is left; an unloaded topic is not an error.
        """
        self._again_on_500(lambda: self.request("PUT", path))

    @staticmethod
    def _again_on_500(call: Callable[[], Any]) -> Any:
        """*call*'s answer, asked again (twice at most, a moment apart) while the broker answers HTTP 500."""
        for attempt in range(_TRANSIENT_TRIES):
            try:
                return call()
            except BrokerError as exc:
                if "HTTP 500" not in str(exc) or attempt == _TRANSIENT_TRIES - 1:
                    raise
            time.sleep(_TRANSIENT_PAUSE_S)  # the broker is mid-way through an ownership change
        raise AssertionError("unreachable")

    def split_bundle(self, namespace: str, bundle: str) -> None:
        """Split one bundle in two halves (``range_equally_divide``) and unload both."""
        path = f"namespaces/{namespace_path(namespace)}/{_check_bundle(bundle)}/split"
        self.request("PUT", f"{path}?unload=true&splitAlgorithmName=range_equally_divide")
