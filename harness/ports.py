"""A free loopback port, and waiting for the server started on one to answer."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx

READY_S = 120  # how long a server may take to answer its first request


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it; another
    process may take it before the caller binds it, which these rigs accept)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, url: str, log: Path, name: str,
               headers: dict | None = None, ready_s: float = READY_S) -> subprocess.Popen:
    """``proc`` once ``GET url`` answers 200; AssertionError with the tail of its
    ``log`` if it exits first, or after ``ready_s`` seconds (then it is killed)."""
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(url, headers=headers or {}, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"{name} did not answer within {ready_s} s")
