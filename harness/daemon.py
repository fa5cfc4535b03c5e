"""A real ``assistd serve`` subprocess on a socket in a scratch folder, started and waited
for: the daemon the serving tests and the daemon benchmarks talk to."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from harness.ports import free_port


@dataclass
class Daemon:
    """A started daemon: its process, socket, database and log file; ``port`` and
    ``token_file`` when it also listens on loopback TCP."""

    proc: subprocess.Popen
    socket: Path
    db: Path
    log: Path
    port: int | None = None
    token_file: Path | None = None

    def env(self) -> dict:
        """Environment for a client process that should find this daemon."""
        return {**os.environ, "ASSISTD_SOCKET": str(self.socket), "ASSISTD_DB": str(self.db)}

    def uds(self, timeout: float = 300) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)),
                            base_url="http://assistd", timeout=timeout)

    def status(self) -> dict:
        with self.uds(10) as c:
            return c.get("/v1/assistd/status").json()

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def start_daemon(tmp: Path, *args: str, tcp: bool = False, db: Path | None = None,
                 wait: float = 180, env: dict | None = None, preexec_fn=None) -> Daemon:
    """``assistd serve`` on a socket in ``tmp`` (and loopback TCP with a token file);
    returns once ``/healthz`` answers. Raises AssertionError with the log if it exits.
    ``env``: more environment (``ASSISTD_*`` settings); ``preexec_fn``: as Popen's."""
    tmp.mkdir(parents=True, exist_ok=True)
    d = Daemon(proc=None, socket=tmp / "run" / "assistd.sock", db=db or tmp / "history.db",
               log=tmp / "daemon.log")
    cmd = [sys.executable, "-m", "assistd", "serve", "--socket", str(d.socket), "--db", str(d.db),
           "--no-agent-transcripts", "--log-file", str(d.log), *args]
    if tcp:
        d.port, d.token_file = free_port(), tmp / "token"
        cmd += ["--tcp", f"127.0.0.1:{d.port}", "--token-file", str(d.token_file)]
    env = {**{k: v for k, v in os.environ.items() if k not in ("ASSISTD_SOCKET",)},
           **(env or {})}
    d.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, preexec_fn=preexec_fn,
                              stderr=open(tmp / "daemon.stderr", "w"))
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if d.proc.poll() is not None:
            raise AssertionError(f"daemon exited {d.proc.returncode}:\n"
                                 + (tmp / "daemon.stderr").read_text()[-3000:])
        if d.socket.exists():
            try:
                with d.uds(2) as c:
                    if c.get("/healthz").status_code == 200:
                        return d
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    d.proc.kill()
    raise AssertionError("daemon did not answer in time:\n"
                         + (tmp / "daemon.stderr").read_text()[-3000:])
