"""Authenticated requests to `assistd serve` while 1,000 unauthenticated clients hold
connections open without finishing a request (issue 21's slowloris / idle flood).

    .venv/bin/python benchmarks/daemon_slow_clients.py [--clients 1000] [--duration 30]
        [--header-timeout-ms 10000] [--max-connections 1024] [--json FILE]

A real daemon (the embedded Target, a Unix socket and loopback TCP with a token) is
started in a temporary folder. ``--clients`` TCP connections are kept open against it
the whole time, half sending a request's headers one byte a second (slow), half
sending nothing (idle); each one the daemon closes (the header timeout, or the cap
making room) is opened again at once, so the flood never lets up. Meanwhile one
authenticated client sends, in turn, ``GET /v1/models`` over TCP (with the token),
the same over the Unix socket, and a 4-token completion over TCP, each on a fresh
connection (as a new client would).

Reported: each request kind's latency (p50, p95, max ms; the goal is p95 <= 1 s);
failed requests; how many flood connections were open on average and how many the
daemon closed (timed out, evicted at the cap, refused); the daemon's descriptors at
most; its log growth in bytes per minute (the goal is < 1 MB/min). The machine's
cores are shared with the flood's own thread: on 2 cores the latencies are an upper
bound.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.daemon import start_daemon  # noqa: E402

SLOW_HEADER = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4096


class Flood:
    """Keeps ``n`` unauthenticated connections open to ``port``: reopens each one the
    daemon closes, and trickles one byte a second into the slow half."""

    def __init__(self, port: int, n: int):
        self.port, self.n = port, n
        self.stop = threading.Event()
        self.open_samples: list[int] = []
        self.reopened = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _connect(self):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect_ex(("127.0.0.1", self.port))
        except OSError:
            s.close()
            return None
        return s

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        socks: dict[socket.socket, list] = {}  # socket -> [index, bytes of header sent]

        def add(i):
            s = self._connect()
            if s is not None:
                socks[s] = [i, 0]
                sel.register(s, selectors.EVENT_READ)

        for i in range(self.n):
            add(i)
        last_trickle = 0.0
        while not self.stop.is_set():
            for key, _ in sel.select(0.2):
                s = key.fileobj
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:  # closed by the daemon: open another at once
                    i = socks.pop(s)[0]
                    sel.unregister(s)
                    s.close()
                    self.reopened += 1
                    add(i)
            now = time.monotonic()
            if now - last_trickle >= 1.0:
                last_trickle = now
                for s, st in socks.items():
                    if st[0] % 2 == 0 and st[1] < len(SLOW_HEADER):  # the slow half
                        try:
                            st[1] += s.send(SLOW_HEADER[st[1]:st[1] + 1])
                        except OSError:
                            pass
                self.open_samples.append(len(socks))
        for s in socks:
            s.close()
        sel.close()


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of measuring")
    ap.add_argument("--header-timeout-ms", type=int, default=10_000)
    ap.add_argument("--max-connections", type=int, default=1024)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the flood's own sockets
    with tempfile.TemporaryDirectory() as tmp:
        d = start_daemon(Path(tmp), tcp=True, env={
            "ASSISTD_HEADER_TIMEOUT_MS": str(args.header_timeout_ms),
            "ASSISTD_MAX_CONNECTIONS": str(args.max_connections)})
        token = d.token_file.read_text().strip()
        try:
            log0 = d.log.stat().st_size
            guard0 = d.status()["connections"]
            flood = Flood(d.port, args.clients)
            flood.thread.start()
            time.sleep(2)  # the flood is up
            lat: dict[str, list[float]] = {"tcp models": [], "unix models": [],
                                           "tcp completion": []}
            failed = 0
            max_fds = 0
            auth = {"Authorization": f"Bearer {token}"}
            url = f"http://127.0.0.1:{d.port}"
            start = time.monotonic()
            while time.monotonic() - start < args.duration:
                for kind in lat:
                    t0 = time.perf_counter()
                    try:
                        if kind == "unix models":
                            with d.uds(30) as c:
                                ok = c.get("/v1/models").status_code == 200
                        elif kind == "tcp models":
                            ok = httpx.get(f"{url}/v1/models", headers=auth,
                                           timeout=30).status_code == 200
                        else:
                            ok = httpx.post(f"{url}/v1/completions", headers=auth, timeout=30,
                                            json={"model": "assistd", "prompt": "def main():",
                                                  "max_tokens": 4, "temperature": 0}
                                            ).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    if ok:
                        lat[kind].append((time.perf_counter() - t0) * 1000)
                    else:
                        failed += 1
                max_fds = max(max_fds, len(os.listdir(f"/proc/{d.proc.pid}/fd")))
                time.sleep(0.1)
            elapsed = time.monotonic() - start
            flood.stop.set()
            flood.thread.join(30)
            guard = d.status()["connections"]
            log_growth = d.log.stat().st_size - log0
        finally:
            d.stop()
    out = {
        "clients": args.clients, "duration_s": round(elapsed, 1),
        "header_timeout_ms": args.header_timeout_ms, "cap": guard["cap"],
        "latency_ms": {k: {"n": len(v), "p50": round(statistics.median(v), 1),
                           "p95": round(percentile(v, 0.95), 1), "max": round(max(v), 1)}
                       for k, v in lat.items() if v},
        "failed": failed,
        "flood_open_mean": round(statistics.mean(flood.open_samples), 0)
        if flood.open_samples else 0,
        "flood_reopened": flood.reopened,
        "daemon_closed": {k: guard[k] - guard0[k] for k in ("timed_out", "evicted", "refused")},
        "daemon_max_fds": max_fds,
        "log_bytes_per_min": round(log_growth / elapsed * 60),
    }
    print(f"{args.clients} unauthenticated connections held open for {elapsed:.0f} s"
          f" (mean open {out['flood_open_mean']:.0f}, reopened {flood.reopened});"
          f" cap {guard['cap']} per transport, header timeout {args.header_timeout_ms} ms")
    for k, v in out["latency_ms"].items():
        print(f"  {k:15s} n={v['n']:4d}  p50 {v['p50']:7.1f} ms  p95 {v['p95']:7.1f} ms"
              f"  max {v['max']:7.1f} ms")
    print(f"  failed requests: {failed}; daemon closed {out['daemon_closed']};"
          f" daemon fds at most {max_fds}; log growth {out['log_bytes_per_min']} bytes/min")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
