"""llama.cpp's own HTTP server (``llama-server``), a second real OpenAI-compatible server
for the remote Target's tests: it takes token-id prompts and tokenizes with
``parse_special``, where llama-cpp-python's server takes text only.

It is built from the llama.cpp sources inside the installed llama-cpp-python's sdist
(the same llama.cpp version as the local Target), the ``llama-server`` target only, into
``$ASSISTD_LLAMA_SERVER_DIR``, else the user cache's ``peers/llama-server-<version>/``
(not ``$ASSISTD_CACHE_DIR``: the test session points that at a fresh folder, and a build
takes minutes):

    .venv/bin/python -m tests.llama_server build [--sdist llama_cpp_python-X.tar.gz]

About 10 minutes on 2 cores; CI does not build it (that would take its run past 45
minutes). The tests that need it skip, saying this, where it is not built
(tests/conftest.py ``llama_cpp_server``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import platformdirs

from harness.ports import wait_ready

BUILD_HINT = ".venv/bin/python -m tests.llama_server build  (about 10 min on 2 cores)"
# As install.sh builds llama-cpp-python on x86-64: x86-64-v3, never -march=native (a VM
# that advertises AMX without enabling it dies with SIGILL on a native build).
X86_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
             "-DGGML_F16C=ON", "-DGGML_BMI2=ON"]


def version() -> str:
    return importlib.metadata.version("llama_cpp_python")


def server_dir() -> Path:
    env = os.environ.get("ASSISTD_LLAMA_SERVER_DIR")
    if env:
        return Path(env)
    cache = Path(platformdirs.user_cache_dir("assistd", appauthor=False))
    return cache / "peers" / f"llama-server-{version()}"


def binary() -> Path | None:
    """The built ``llama-server``, or None."""
    path = server_dir() / "llama-server"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _run(cmd: list[str], log: Path) -> None:
    with open(log, "a") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        sys.exit(f"llama-server build: {cmd[0]} {cmd[1]} failed (exit {done.returncode});"
                 f" its output: {log}")


def build(sdist: Path | None = None) -> Path:
    """Build once (a finished build is reused); return the binary's path. Exits with a
    message naming the failed step and its log."""
    done = binary()
    if done is not None:
        return done
    base = server_dir()
    base.mkdir(parents=True, exist_ok=True)
    log = base / "build.log"
    log.write_text("")
    name = f"llama_cpp_python-{version()}"
    if sdist is None:
        sdist = base / f"{name}.tar.gz"
        if not sdist.is_file():
            print(f"downloading {name} (the sdist) with pip", file=sys.stderr)
            _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                  "--no-binary", ":all:", f"llama-cpp-python=={version()}", "-d", str(base)], log)
    src = base / "src"
    shutil.rmtree(src, ignore_errors=True)
    root = f"{name}/vendor/llama.cpp/"
    print(f"extracting {root}", file=sys.stderr)
    with tarfile.open(sdist) as tar:
        tar.extractall(src, members=[m for m in tar.getmembers() if m.name.startswith(root)],
                       filter="data")
    llama_cpp = src / root
    flags = X86_FLAGS if platform.machine() == "x86_64" else []
    print("cmake configure", file=sys.stderr)
    _run(["cmake", "-S", str(llama_cpp), "-B", str(base / "build"), "-DCMAKE_BUILD_TYPE=Release",
          "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
          "-DLLAMA_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF", *flags], log)
    print("cmake build --target llama-server", file=sys.stderr)
    _run(["cmake", "--build", str(base / "build"), "--target", "llama-server",
          "--parallel", str(os.cpu_count() or 1)], log)
    built = base / "build" / "bin" / "llama-server"
    shutil.copy2(built, base / "llama-server.part")
    os.replace(base / "llama-server.part", base / "llama-server")  # last: "built"
    shutil.rmtree(src, ignore_errors=True)
    return base / "llama-server"


def start(port: int, model: Path, log: Path, n_ctx: int = 4096) -> subprocess.Popen:
    """``llama-server`` with ``model`` on loopback; returns once ``/health`` says ok
    (AssertionError with its log if it exits or is not ready within 120 s)."""
    proc = subprocess.Popen([str(binary()), "-m", str(model), "--host", "127.0.0.1",
                             "--port", str(port), "-c", str(n_ctx), "-t", "2", "-np", "1",
                             "--no-webui"],
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    return wait_ready(proc, f"http://127.0.0.1:{port}/health", log, "llama-server")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m tests.llama_server")
    ap.add_argument("command", choices=["build"])
    ap.add_argument("--sdist", type=Path, default=None,
                    help="a local llama_cpp_python-<version>.tar.gz instead of pip's download")
    print(build(ap.parse_args().sdist))
