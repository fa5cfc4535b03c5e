"""Plain decoding under other numerics, in a process of its own, for ``assistd bench``.

ggml reads ``GGML_CPU_TILED_MM`` once per process (:func:`assistd.targets.llama.fix_tiled_mm`),
so llama.cpp as it ships (numerics ``llama``, the baseline every speedup is against)
cannot share a process with ``fast`` or ``exact``, which turn it off. ``assistd bench`` starts one companion per other
mode, ``python -m assistd.measure.bench_companion``, and drives it over a pipe so that its
runs interleave with the main process's arms on the same prompts, one at a time (the
main process waits while the companion decodes, so they never share the cores).

Protocol: one JSON object a line. The companion first writes
``{"ready": true, "numerics": ..., "promise": ..., "threads": ...}``, then answers each
request on stdin with one line:

- ``{"op": "prefill", "prompt": [ids]}`` -> ``{"ok": true}`` (untimed, as the main
  process's prefill);
- ``{"op": "run", "prompt": [ids], "max_tokens": n}`` -> ``{"tokens": [ids],
  "committed": n, "decode_ms": ms, "counters": {...}}``: plain greedy decoding after
  the cached prompt (the engine with no proposer; ``counters``: its
  :meth:`~assistd.ground.ledger.Ledger.counters`);
- ``{"op": "calibrate"}`` -> ``{"points": {n: ms}}``: this process's t(n) at the
  calibration's context (:meth:`assistd.ground.costmodel.CostModel.calibrate`);
- end of input: the companion closes its Target and exits 0.

An error is answered ``{"error": "message"}`` and the companion goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from assistd.ground.errors import ModelError
from assistd.ground.process import exit_when_orphaned


def serve(model: str | None, n_ctx: int, threads: int | None, numerics: str,
          stdin=None, stdout=None) -> None:
    """Open the Target and answer requests until end of input (see the module)."""
    from assistd.decoding.engine import generate
    from assistd.targets.open import open_target

    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    target = open_target(Path(model) if model else None, backend="llama", n_ctx=n_ctx,
                         n_threads=threads, numerics=numerics)
    try:
        _say(stdout, {"ready": True, "numerics": target.numerics, "promise": target.promise,
                      "threads": target.n_threads})
        for line in stdin:
            if not line.strip():
                continue
            try:
                req = json.loads(line)
                op = req.get("op")
                if op == "prefill":
                    generate(target, req["prompt"], None, max_tokens=1, k=0)
                    _say(stdout, {"ok": True})
                elif op == "run":
                    g = generate(target, req["prompt"], None, max_tokens=int(req["max_tokens"]),
                                 k=0)
                    _say(stdout, {"tokens": g.tokens, "committed": g.ledger.committed_tokens,
                                  "decode_ms": g.ledger.decode_ms,
                                  "counters": g.ledger.counters()})
                elif op == "calibrate":
                    from assistd.ground.costmodel import CostModel

                    _say(stdout, {"points": CostModel.calibrate(target).as_dict().get("points")})
                else:
                    _say(stdout, {"error": f"unknown op {op!r}"})
            except (ValueError, KeyError, TypeError, RuntimeError) as e:
                _say(stdout, {"error": f"{type(e).__name__}: {e}"})
    finally:
        target.close()


def _say(stdout, obj: dict) -> None:
    stdout.write(json.dumps(obj) + "\n")
    stdout.flush()


class Companion:
    """The main process's end: starts ``python -m assistd.measure.bench_companion`` for
    ``numerics`` on the same model, context and threads. Raises :class:`ModelError` when
    the companion cannot open its Target (its last stderr line in the message)."""

    def __init__(self, model, *, n_ctx: int, threads: int | None, numerics: str):
        cmd = [sys.executable, "-m", "assistd.measure.bench_companion", "--numerics", numerics,
               "--n-ctx", str(n_ctx)]
        if model is not None:
            cmd += ["--model", str(model)]
        if threads:
            cmd += ["--threads", str(threads)]
        env = dict(os.environ)
        env.pop("GGML_CPU_TILED_MM", None)  # the companion's mode sets its own
        self.numerics = numerics
        # stderr to a file, not a pipe nobody reads until the end (llama.cpp may log).
        self._err = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._err, text=True, env=env)
        hello = self._read()
        self.promise, self.threads = hello.get("promise"), hello.get("threads")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self._err.seek(0)
            err = self._err.read().strip().splitlines()
            raise ModelError(f"the {self.numerics} numerics companion process ended: "
                             f"{err[-1] if err else 'no message'}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"{self.numerics} companion: {reply['error']}")
        return reply

    def ask(self, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def prefill(self, prompt: list[int]) -> None:
        self.ask(op="prefill", prompt=[int(t) for t in prompt])

    def run(self, prompt: list[int], max_tokens: int) -> dict:
        return self.ask(op="run", prompt=[int(t) for t in prompt], max_tokens=max_tokens)

    def calibrate(self) -> dict[str, float]:
        return self.ask(op="calibrate")["points"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._err.close()


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m assistd.measure.bench_companion",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--n-ctx", type=int, required=True)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--numerics", required=True)
    a = ap.parse_args(argv)
    exit_when_orphaned()  # a killed bench must not leave this decoding for tens of seconds
    # Keep the protocol's stdout clean of anything a library might print.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        serve(a.model, a.n_ctx, a.threads, a.numerics, stdout=out)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
