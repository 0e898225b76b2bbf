"""A quiet ``pulsar.Client`` for tests, examples, benchmarks and the demo."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pulsar

__all__ = ["CLIENT_LOGGER", "quiet_client"]

CLIENT_LOGGER = "pulsar_nack.testing.client"
"""The name of the Python logger that :func:`quiet_client`'s clients log to."""


def quiet_client(url: str, **kwargs: Any) -> pulsar.Client:
    """Create a ``pulsar.Client`` whose log goes to Python's :mod:`logging`, warnings and up.

    The C++ client logs several INFO lines per connection, producer and consumer, and
    ``pulsar.ConsoleLogger`` writes them to **stdout** (checked with pulsar-client 3.13),
    where they would mix with a program's output. Here they go to the logger named
    :data:`CLIENT_LOGGER`: below WARNING they are dropped, and without a logging setup
    Python prints warnings and errors on stderr. Works for any URL.

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
    logger = logging.getLogger(CLIENT_LOGGER)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)
    kwargs.setdefault("logger", logger)
    return pulsar.Client(url, **kwargs)
