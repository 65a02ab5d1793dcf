"""engine.trace.forked.ForkedCall: a result read from the pipe as it is unpickled; a child that
dies before or while sending it is an error that says so, never a partial value."""

from __future__ import annotations

import os

import pytest

from engine.trace.forked import ForkedCall

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def test_a_large_result_comes_back_whole_and_an_exception_is_raised_here():
    big = {"columns": [bytes(range(256)) * 40_000 for _ in range(8)], "n": 7}  # 80 MB through the pipe
    call = ForkedCall(lambda: big, "a test child")
    assert call.result() == big and call.pid == 0 and call.seconds is not None

    def fails():
        raise ValueError("bad event 12")
    with pytest.raises(ValueError, match="bad event 12"):
        ForkedCall(fails, "a test child").result()


def test_a_child_that_dies_before_its_result_or_while_sending_it_is_an_error():
    with pytest.raises(RuntimeError, match="a test child ended without a result"):
        ForkedCall(lambda: os._exit(3), "a test child").result()
    # A result cut short: a child (made here the way ForkedCall makes its own) that writes half of
    # a pickled outcome into the pipe and exits.
    import pickle
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        data = pickle.dumps(("ok", b"x" * 1_000_000, 0.0))
        os.write(write_fd, data[:len(data) // 2])
        os._exit(0)
    os.close(write_fd)
    call = ForkedCall.__new__(ForkedCall)
    call.what, call.seconds, call.first_message, call._first_read = "a test child", None, False, False
    call.pid, call.fh = pid, os.fdopen(read_fd, "rb")
    with pytest.raises(RuntimeError, match="a test child ended without a result"):
        call.result()
    assert call.pid == 0
