"""What the daemon tests wait on: a condition, sockets the daemon closes, its open
descriptors. Starting the daemon itself is harness.daemon's (the benchmarks use it too)."""

from __future__ import annotations

import os
import selectors
import socket
import time

# Until tests/test_one_target.py imports it from harness.daemon (the rig's home):
from harness.daemon import start_daemon  # noqa: F401


def wait_for(pred, timeout: float = 60) -> bool:
    """Poll ``pred`` until it is true (generous timeout: only against a hang)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def wait_closed(socks: list[socket.socket], timeout: float) -> int:
    """Wait until the daemon has closed each of ``socks`` (EOF or reset); returns how
    many it has not closed by ``timeout`` (generous: only against a hang)."""
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    left = len(socks)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        for key, _ in sel.select(1):
            try:
                data = key.fileobj.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(key.fileobj)
                left -= 1
    sel.close()
    return left


def open_fds(pid: int) -> int:
    """How many descriptors process ``pid`` holds."""
    return len(os.listdir(f"/proc/{pid}/fd"))
