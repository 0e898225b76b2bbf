"""A quiet ``pulsar.Client`` for tests, examples, benchmarks and the demo."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pulsar

from ..consumer.client_log import stderr_logger

__all__ = ["quiet_client"]


def quiet_client(url: str, **kwargs: Any) -> pulsar.Client:
    """Create a ``pulsar.Client`` that logs warnings and errors to standard error.

    The C++ client logs several INFO lines per connection, producer and consumer, and
    ``pulsar.ConsoleLogger`` writes them to **stdout** (checked with pulsar-client 3.13),
    where they would mix with a program's output. These clients write WARN and up to
    standard error through the C++ client's own ``pulsar.FileLogger``.

    See :mod:`pulsar_nack.consumer.client_log` for why not a Python logger.

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
    if "logger" not in kwargs:
        kwargs["logger"] = stderr_logger("warn")
    return pulsar.Client(url, **kwargs)

