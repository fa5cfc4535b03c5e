"""The LSP tests' raw side: framed JSON-RPC over a socket, and waiting on a condition.
The client session helpers are harness.lsp's (the benchmarks use them too)."""

from __future__ import annotations

import asyncio
import json
import socket


# -- raw JSON-RPC over a socket (where a test needs the bytes, not a client) ----------

def frame(payload: dict) -> bytes:
    """``payload`` as one LSP message: Content-Length header, JSON body."""
    body = json.dumps(payload).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def answers(out: bytes) -> list[dict]:
    """Every framed message in a server's whole stdout, in order."""
    found = []
    while out:
        head, _, rest = out.partition(b"\r\n\r\n")
        size = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        found.append(json.loads(rest[:size]))
        out = rest[size:]
    return found


def read_message(sock: socket.socket) -> dict | None:
    """One framed message, or None when the peer closed the connection."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        ch = sock.recv(1)
        if not ch:
            return None
        head += ch
    n = int(head.split(b"Content-Length:")[1].split(b"\r\n")[0])
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


def rpc(sock: socket.socket, msg_id, method: str, params=None) -> dict:
    """Send a request and return its response, skipping the server's notifications."""
    sock.sendall(frame({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}))
    while True:
        out = read_message(sock)
        assert out is not None, f"connection closed waiting for {method}"
        if out.get("id") == msg_id and "method" not in out:
            return out


async def until(pred, timeout=120.0):
    """Wait for ``pred()`` (a generous bound against hangs, not a timing assert)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.05)
