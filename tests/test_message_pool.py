"""KeepingProducer: a sent message is freed on a sending thread, so the C++ client's message pool stays small.

The C++ client pools the memory of built messages per thread (``consumer/message_pool.py``
says how). These tests build real ``_pulsar`` messages and measure glibc's bytes in use
(``mallinfo2``), but send them to a stand-in producer: which thread frees a message is the
point, and a broker cannot choose it. The stand-in answers each send on a thread of its
own and then drops its copy, in the order the client's I/O thread does (the callback,
then the copy). Each measurement runs in a fresh interpreter: the pool is per process,
and earlier tests would have filled it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
import sys
import textwrap

import pytest

from pulsar_nack.consumer.message_pool import KeepingProducer

_MEASURE = textwrap.dedent(
    """
    import ctypes, queue, sys, threading
    from pulsar_nack.consumer._client import build_message
    from pulsar_nack.consumer.message_pool import KeepingProducer

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2

    class IoThreadProducer:
        '''Answers each send on its own thread, then drops its copy of the message, as the client does.'''
        def __init__(self):
            self.queue = queue.Queue()
            threading.Thread(target=self.run, daemon=True).start()
        def send_async(self, message, callback):
            self.queue.put((message, callback))
        def run(self):
            while True:
                message, callback = self.queue.get()
                callback("Ok", None)
                del message, callback
                self.queue.task_done()

    producer = IoThreadProducer()
    keeping = KeepingProducer(producer)
    sender = keeping if sys.argv[1] == "keeping" else producer
    def send(i):
        sender.send_async(build_message(b"x" * 100, {"k": str(i)}, None, None), lambda result, message_id: None)
    def sends(n):
        for i in range(n):
            send(i)
            if i % 50 == 49:  # a few sends in flight at a time, as a consumer's dead letters
                producer.queue.join()
        producer.queue.join()
        send(n)  # frees what the last ones left
        producer.queue.join()
    sends(1000)  # warm-up
    before = libc.mallinfo2().uordblks
    sends(MESSAGES)
    print((libc.mallinfo2().uordblks - before) / MESSAGES, keeping.kept())
    """
)
_MESSAGES = 8000


def _bytes_left_per_message(mode: str) -> tuple[float, int]:
    """(heap bytes in use left per message sent, messages kept at the end), in a fresh interpreter."""
    script = _MEASURE.replace("MESSAGES", str(_MESSAGES))
    done = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=120, check=True)
    per_message, kept = done.stdout.split()
    return float(per_message), int(kept)


def _has_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _has_mallinfo2(), reason="glibc's mallinfo2 (2.33+) measures the heap")
def test_messages_sent_through_it_leave_nothing_in_the_clients_pool() -> None:
    """The control (the stand-in frees every message on its own thread) leaves a pooled block per
    message; sent through KeepingProducer, the blocks come back to the sending thread and are reused."""
    control, _ = _bytes_left_per_message("control")
    assert control > 300, f"the client's pool no longer keeps a block per message freed elsewhere ({control:.0f} B)"
    per_message, kept = _bytes_left_per_message("keeping")
    assert per_message < 30, f"{per_message:.0f} bytes left per message (the control: {control:.0f})"
    assert kept == 2  # the one answered before the last send (kept in case its copy was not dropped yet), and the last


class _AnswersAtOnce:
    def __init__(self) -> None:
        self.sent: list[object] = []
        self.closed = False

    def send_async(self, message: object, callback: object) -> None:
        self.sent.append(message)
        assert callable(callback)
        callback("Ok", "id")

    def close(self) -> None:
        self.closed = True


def test_it_frees_at_each_send_all_but_the_last_answered_and_close_frees_all() -> None:
    producer, answers = _AnswersAtOnce(), []
    keeping = KeepingProducer(producer)
    for i in range(5):
        keeping.send_async(f"m{i}", lambda result, message_id: answers.append((result, message_id)))
        assert keeping.kept() == min(i + 1, 2)  # the one answered before this send, and this one
    assert producer.sent == [f"m{i}" for i in range(5)]
    assert answers == [("Ok", "id")] * 5
    keeping.close()
    assert producer.closed
    assert keeping.kept() == 0


def test_a_send_that_raises_keeps_nothing() -> None:
    class Closed:
        def send_async(self, message: object, callback: object) -> None:
            raise RuntimeError("AlreadyClosed")

    keeping = KeepingProducer(Closed())
    with pytest.raises(RuntimeError, match="AlreadyClosed"):
        keeping.send_async("m", lambda result, message_id: None)
    assert keeping.kept() == 0
