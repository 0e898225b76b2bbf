"""A quiet ``pulsar.Client`` for tests, examples, benchmarks and the demo."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pulsar

__all__ = ["quiet_client"]


def quiet_client(url: str, **kwargs: Any) -> pulsar.Client:
    """Create a ``pulsar.Client`` that logs only warnings and errors.

    The C++ client logs several INFO lines per connection, producer and
    consumer to stderr. ``pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)``
    drops them (checked with pulsar-client 3.13). Works for any URL.

    Parameters
    ----------
    url : str
        The Pulsar service URL.
    **kwargs
        Passed to ``pulsar.Client``. A ``logger`` given here wins.

    Returns
    -------
    pulsar.Client
        A new client; the caller closes it.

    Raises
    ------
    TypeError
        If ``url`` is not a str.

    Examples
    --------
    A client connects on first use, so this needs no broker:

    >>> client = quiet_client("pulsar://127.0.0.1:6650")
    >>> client.close()
    """
    import pulsar

    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    kwargs.setdefault("logger", pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    return pulsar.Client(url, **kwargs)

