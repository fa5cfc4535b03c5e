"""Build Arctic Inference 0.3.0's SuffixDecoding extension into the user cache, on request.

The peers ``peer:arctic`` and ``peer:arctic-tree`` (proposers/arctic.py) run the real
``arctic_inference.suffix_decoding._C`` module, so that ``replay`` and ``bench`` compare
``suffix`` with the real thing and not only with our reading of it. Its code is never
part of this repository: :func:`build` fetches the sdist from PyPI with pip, builds only
``csrc/suffix_decoding`` (C++20, nanobind, CMake >= 3.18) and leaves, under
``<cache>/peers/arctic-inference-0.3.0/`` (``<cache>``: ``$ASSISTD_CACHE_DIR``, else the
user cache dir):

- ``arctic_inference/suffix_decoding/_C*.so``: the built extension;
- ``arctic_inference/suffix_decoding/*.py``: Arctic's own Python API (``SuffixDecodingCache``),
  importable with that folder on ``sys.path`` (the tests compare against it);
- ``sdist/``, ``src/``, ``build/``, ``tmp/``: the download, the extracted sources, CMake's
  tree and the steps' temporary files (pip runs with ``--no-cache-dir``).

Nothing is written outside that folder. The build takes ~30 s on 2 cores (download included).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

from assistd.ground.errors import AssistdError
from proposers.arctic import MODULE_DIR, SDIST_NAME, VERSION, built_module, peer_dir

TAIL_CHARS = 3000  # of a failed step's output, in the error
SDIST_KEEP = ("csrc/suffix_decoding/", "arctic_inference/__init__.py",
              "arctic_inference/suffix_decoding/", "LICENSE")


class PeerBuildError(AssistdError):
    """The Arctic peer cannot be built here: the message names the step and shows its output.

    ``step``: "download", "extract", "tools" (cmake, nanobind or a compiler missing),
    "configure" or "build"."""

    def __init__(self, message: str, step: str):
        super().__init__(message)
        self.step = step


def _run(step: str, what: str, cmd: list[str], tmp: Path, timeout: float = 1800) -> None:
    """Run one step; its temporary files go under ``tmp`` (inside the cache), not /tmp."""
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "TMPDIR": str(tmp)})
    except FileNotFoundError:
        raise PeerBuildError(f"arctic peer: {what}: {cmd[0]!r} is not installed",
                             "tools") from None
    except subprocess.TimeoutExpired:
        raise PeerBuildError(f"arctic peer: {what}: no result after {timeout:.0f} s",
                             step) from None
    if done.returncode:
        out = done.stdout + done.stderr
        if step == "configure" and "CMAKE_CXX_COMPILER" in out:
            step = "tools"  # no C++ compiler: a condition of the machine, not of the code
        raise PeerBuildError(f"arctic peer: {what} failed (exit {done.returncode}):\n"
                             f"{out[-TAIL_CHARS:]}", step)


def _download(into: Path, sdist: Path | None) -> Path:
    """The sdist: ``sdist`` if given (copied in), else pip's download from PyPI."""
    into.mkdir(parents=True, exist_ok=True)
    if sdist is not None:
        if not sdist.is_file():
            raise PeerBuildError(f"arctic peer: {sdist} is not a file", "download")
        shutil.copy2(sdist, into / SDIST_NAME)
    found = into / SDIST_NAME
    if not found.is_file():
        # --no-build-isolation: pip prepares the sdist's metadata in this environment
        # (the dev extras hold its build requirements) instead of fetching them.
        # --no-cache-dir: nothing in pip's own cache, outside ours.
        _run("download", "download (pip)",
             [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
              "--no-binary", ":all:", "--no-build-isolation", f"arctic-inference=={VERSION}",
              "-d", str(into)], into.parent / "tmp")
        if not found.is_file():
            raise PeerBuildError(f"arctic peer: pip left no {SDIST_NAME} in {into}", "download")
    return found


def _extract(archive: Path, into: Path) -> Path:
    """Only the suffix-decoding sources and Python API, under ``into``; the sdist's root."""
    root = f"arctic_inference-{VERSION}/"
    try:
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(root)
                       and m.name[len(root):].startswith(SDIST_KEEP)]
            tar.extractall(into, members=members, filter="data")
    except (tarfile.TarError, OSError) as e:
        raise PeerBuildError(f"arctic peer: extract {archive.name}: {e}", "extract") from None
    src = into / root
    if not (src / "csrc/suffix_decoding/CMakeLists.txt").is_file():
        raise PeerBuildError(f"arctic peer: {archive.name} has no csrc/suffix_decoding", "extract")
    return src


def build(sdist: Path | None = None, log: Callable[[str], None] | None = None) -> Path:
    """Build the extension once; return the built module's path.

    Idempotent: a finished build is reused (it is found by
    :func:`proposers.arctic.built_module`). ``sdist``: a local
    ``arctic_inference-0.3.0.tar.gz`` instead of pip's download (no network then).
    ``log`` is told each step. Raises :class:`PeerBuildError` naming the step that failed
    (download, extract, cmake configure, cmake build) with the tail of its output; its
    ``step`` is "tools" when cmake, nanobind or a C++ compiler is missing.
    """
    done = built_module()
    if done is not None:
        return done
    say = log or (lambda _msg: None)
    base = peer_dir()
    say(f"fetching arctic-inference {VERSION} into {base}")
    archive = _download(base / "sdist", sdist)
    say("extracting csrc/suffix_decoding")
    shutil.rmtree(base / "src", ignore_errors=True)
    try:
        src = _extract(archive, base / "src")
    except PeerBuildError as e:
        # A bad archive (a wrong --sdist, a broken download) must not be reused by the
        # next build: drop it, so that a plain `assistd peers build arctic` downloads again.
        archive.unlink(missing_ok=True)
        if sdist is None:
            raise
        raise PeerBuildError(f"{e} (from --sdist {sdist}: not Arctic Inference {VERSION}'s"
                             " sdist)", e.step) from None
    try:
        import nanobind  # noqa: F401  (its CMake files: `python -m nanobind --cmake_dir`)
    except ImportError:
        raise PeerBuildError("arctic peer: nanobind is not installed in this environment: "
                             "pip install 'nanobind==2.9.2' (Arctic 0.3.0's pin)",
                             "tools") from None
    out = base / MODULE_DIR
    tmp_out = base / "build" / "out"
    shutil.rmtree(base / "build", ignore_errors=True)
    say("cmake configure")
    _run("configure", "cmake configure",
         ["cmake", "-S", str(src / "csrc/suffix_decoding"), "-B", str(base / "build"),
          "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}",
          f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={tmp_out}"], base / "tmp")
    say("cmake build (C++, ~30 s on 2 cores)")
    _run("build", "cmake build",
         ["cmake", "--build", str(base / "build"), "--parallel", str(os.cpu_count() or 1)],
         base / "tmp")
    built = sorted(tmp_out.glob("_C*"))
    if not built:
        raise PeerBuildError(f"arctic peer: cmake build left no _C module in {tmp_out}", "build")
    # The package beside it, from the sdist: Arctic's Python API over the module.
    shutil.rmtree(base / "arctic_inference", ignore_errors=True)
    shutil.copytree(src / "arctic_inference", base / "arctic_inference")
    # Last, and atomic: the module's presence means "built".
    shutil.copy2(built[0], out / (built[0].name + ".part"))
    os.replace(out / (built[0].name + ".part"), out / built[0].name)
    return out / built[0].name
