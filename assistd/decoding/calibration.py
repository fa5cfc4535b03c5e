"""The calibration cache: t(n, context) measured once per Target and machine, not once per
history.

:meth:`CostModel.calibrate` takes ~3 s on a quiet 2-core machine (its first level alone
~1.6 s, 16.8 s was seen for it on a busy one; the second ~1.9x the first in all, measured
here under load), and every new history database (a new user, every test, a bench run)
would pay it again. So a calibration is also kept in
``<cache>/calibration/<backend>-<hash of the key>.json`` (``<cache>``:
``$ASSISTD_CACHE_DIR``, else the user cache dir, as the torch weights), keyed by

- the Target: backend and its package version, model file (name, size, a digest of its
  first and last MiB), device (GPU layers included), threads, numerics, dtype, and the
  accelerator by name (torch's CUDA device name: another card, another t(n));
- the machine: CPU model, architecture, core count, usable cores;
- :data:`CACHE_VERSION` (the calibration method; version 1 files, t(n) at one context,
  are not read and the Target is measured again), and the context of the second level
  when the Target's window holds it (none when it does not).

The context window itself is not in the key: the levels are at 64 and
:data:`~assistd.ground.costmodel.LONG_CONTEXT` tokens whatever the window. Files are
written atomically (a temporary file, then ``os.replace``) and read defensively: a
corrupt file, or one whose key is not ours, is a warning, a new calibration and an
overwrite, never a crash. A calibration that fell
back to the reference curve (a busy machine, :attr:`CostModel.note`) is kept for
:data:`BUSY_TTL_S` only: the load is usually gone by then, and a new database then
measures again, while those made meanwhile (a test run) do not pay for it each.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
import time
from importlib import metadata
from pathlib import Path

from assistd.ground.costmodel import LONG_CONTEXT, LONG_SIZES, CostModel
from assistd.ground.errors import InputError
from assistd.targets.hf import cache_root

CACHE_VERSION = 2  # bump when CostModel.calibrate measures differently (2: t(n, context))
DIGEST_BYTES = 1 << 20  # the model file's head and tail that are hashed
BACKEND_PACKAGES = {"llama": "llama_cpp_python", "torch": "torch"}
BUSY_TTL_S = 3600.0  # how long a busy machine's fallback calibration is reused (s)

log = logging.getLogger("assistd.tuner")


def cache_dir() -> Path:
    return cache_root() / "calibration"


def _file_digest(path: Path) -> str:
    """sha256 of a file's size, first and last MiB: a few ms for any model size, and
    two quantisations of one model (same name elsewhere, same tokenizer) differ."""
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            h.update(str(size).encode())
            h.update(f.read(DIGEST_BYTES))
            f.seek(max(0, size - DIGEST_BYTES))
            h.update(f.read(DIGEST_BYTES))
    except OSError:  # a model directory (torch) or an unreadable file: name only
        return ""
    return h.hexdigest()[:32]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            name, _, value = line.partition(":")
            if name.strip() in ("model name", "Model", "Hardware", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_identity() -> dict:
    """What makes this machine's t(n) its own: CPU model, architecture, cores."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    return {"cpu": _cpu_model(), "arch": platform.machine(), "system": platform.system(),
            "cores": os.cpu_count() or 0, "usable_cores": usable}


def _accelerator(target) -> str:
    """The GPU a Target runs on, by name ("" on the CPU): the same model and machine
    have another t(n) on another card. torch names its CUDA device; llama.cpp does not
    say which card it offloads to, only how many layers (in ``device``)."""
    device = str(getattr(target, "device", ""))
    if target.backend == "torch" and device.startswith("cuda"):
        try:
            import torch

            return torch.cuda.get_device_name(torch.device(device))
        except (ImportError, RuntimeError, AssertionError):
            return "cuda"
    return "" if device == "cpu" else device


def target_identity(target) -> dict:
    """What makes a loaded Target's t(n) its own (see the module docstring)."""
    path = Path(str(target.model_path))
    try:
        version = metadata.version(BACKEND_PACKAGES.get(target.backend, "assistd"))
    except metadata.PackageNotFoundError:
        version = ""
    return {"backend": target.backend, "backend_version": version, "model": path.name,
            "digest": _file_digest(path) if path.is_file() else "", "device": str(target.device),
            "threads": getattr(target, "n_threads", None), "numerics": target.numerics,
            "dtype": str(getattr(target, "dtype", "")), "accelerator": _accelerator(target)}


def calibration_key(target) -> dict:
    """The cache key of ``target`` on this machine: a JSON-able dict."""
    fits = LONG_CONTEXT + max(LONG_SIZES) < getattr(target, "n_ctx", 0)
    return {"version": CACHE_VERSION, "target": target_identity(target),
            "machine": machine_identity(), "long_context": LONG_CONTEXT if fits else None}


def cache_file(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_dir() / f"{key['target']['backend'] or 'target'}-{digest}.json"


def read_cached(key: dict, now: float | None = None) -> CostModel | None:
    """The cached calibration for ``key``, or None: none yet, a busy machine's fallback
    older than :data:`BUSY_TTL_S`, or a file that cannot be one (damaged, or another
    key's), which is said in a warning and will be replaced. ``now``: s since epoch."""
    path = cache_file(key)
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict) or raw.get("key") != key:
            raise ValueError("its key is not this Target's on this machine")
        note, when = raw.get("note", ""), raw.get("calibrated_utc")
        if not isinstance(note, str) or not isinstance(when, (int, float)):
            raise ValueError("no note or time of calibration")
        cm = CostModel.load(path)  # the same checks as any cost model file
    except FileNotFoundError:
        return None
    except (OSError, ValueError, InputError) as e:  # JSONDecodeError is a ValueError
        log.warning("calibration cache %s is unusable (%s): calibrating again", path, e)
        return None
    if note and (time.time() if now is None else now) - when > BUSY_TTL_S:
        log.info("calibration cache %s holds a busy machine's fallback from over %.0f s"
                 " ago: calibrating again", path, BUSY_TTL_S)
        return None
    return CostModel(cm.points, source=f"cached:{path}", note=note, context=cm.context,
                     levels=cm.levels)


def write_cached(key: dict, cost: CostModel, seconds: float) -> Path | None:
    """Write ``cost`` for ``key`` atomically; returns the file, or None (and a warning)
    when the cache dir is not writable: the calibration is then only in the history."""
    path = cache_file(key)
    body = {"key": key, **cost.as_dict(), "note": cost.note, "seconds": round(seconds, 3),
            "calibrated_utc": time.time()}
    body.pop("source", None)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(body, indent=1) + "\n")
        os.replace(tmp, path)  # readers see the old file or the new one, never half
    except OSError as e:
        log.warning("cannot write the calibration cache %s (%s): the next new history"
                    " calibrates again", path, e)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return None
    return path


def calibration(target, *, use_cache: bool = True) -> tuple[CostModel, str]:
    """t(n, context) of a loaded Target: from the cache, else measured
    (:meth:`CostModel.calibrate`) and cached. Returns the cost model and how it was got:
    ``"cache FILE"`` or ``"calibrated in S s"`` (plus where it was cached, or why not).
    ``use_cache=False`` measures and writes nothing to the cache (a fresh calibration)."""
    key = calibration_key(target) if use_cache else None
    if key is not None:
        cost = read_cached(key)
        if cost is not None:
            how = f"cache {cache_file(key)}" + (f"; {cost.note}" if cost.note else "")
            log.info("t(n) of %s from %s: %s", target.backend, how, _fmt(cost))
            return cost, how
    t0 = time.perf_counter()
    cost = CostModel.calibrate(target)
    seconds = time.perf_counter() - t0
    how = f"calibrated in {seconds:.2f} s"
    if key is None:
        how += " (cache not used)"
    else:
        written = write_cached(key, cost, seconds)
        how += f" (cached in {written})" if written else " (not cached)"
    if cost.note:
        how += f"; {cost.note}"
    log.info("t(n) of %s %s: %s", target.backend, how, _fmt(cost))
    return cost, how


def _fmt(cost: CostModel) -> str:
    text = ", ".join(f"t({n}) = {ms:.1f} ms" for n, ms in sorted(cost.points.items()))
    for context, points in sorted(cost.levels.items()):
        text += f"; after {context} tokens: " + ", ".join(
            f"t({n}) = {ms:.1f} ms" for n, ms in sorted(points.items()))
    return text
