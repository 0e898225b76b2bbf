"""Reading a received message's id through libpulsar's C++ API: turned on once, where the client allows it.

The C reader (``pulsar_nack.consumer._msgid``) reads a message's id through two binding
calls, ``message_id()`` and ``serialize()``. Where the installed pulsar-client lets it
(its ``_pulsar`` module built with pybind11's ``_pybind11_conduit_v1_``, as every
supported release is, 3.9 to 3.13, and libpulsar exporting the id accessors of its public
headers), it reads the fields through libpulsar instead, without a Python call or an
allocation.
:func:`bind` checks everything it relies on, once, and leaves the reader off otherwise;
``_native_id.h`` says what. The results are the same either way (``tests/test_msgid.py``
compares them on received messages of every kind); only the cost differs.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["bind", "unbind"]

_INTERNALS_KEY = re.compile(r"__pybind11_internals_v\d+_(?P<abi>.+)__")
"""pybind11's internals key: ``__pybind11_internals_v<version>_<platform ABI id>__``."""
_POINTER_KIND = b"raw_pointer_ephemeral"


def _abi_ids(reader: Any) -> list[bytes]:
    """The platform ABI ids of the pybind11 internals in this interpreter (the conduit wants its module's)."""
    found = (_INTERNALS_KEY.fullmatch(key) for key in reader.pybind11_abi_ids())
    return [match.group("abi").encode() for match in found if match is not None]


def bind(reader: Any) -> bool:
    """Turn on *reader*'s native id reads (the C module ``_msgid``); True if on. Idempotent.

    False, the reader unchanged, when the client offers no conduit (pulsar-client before
    3.9), a symbol is missing, or the probe does not read as expected.
    """
    if reader is None or not hasattr(reader, "bind_native"):
        return False
    if reader.native_bound():
        return True
    from ._client import native_probe

    path, probe = native_probe()
    type_info = reader.native_type_info(path)
    conduit = getattr(probe, "_pybind11_conduit_v1_", None)
    if type_info is None or conduit is None:  # an older client, or libpulsar without the accessors
        return False
    for abi in _abi_ids(reader):
        pointer = conduit(abi, type_info, _POINTER_KIND)
        if pointer is not None:  # the module's own ABI id: it handed over the probe's pulsar::Message
            return bool(reader.bind_native(probe, pointer))
    return False


def unbind(reader: Any) -> None:
    """Read every id through the bindings again (to compare both ways)."""
    if reader is not None and hasattr(reader, "unbind_native"):
        reader.unbind_native()
