"""What a GPU run needs beyond the working tree, and the 64 MiB it must fit in.

A run of the project's GPU machine takes the working tree (git's tracked files plus the
untracked ones it does not ignore) and the ignored paths named in ``carry``: at most
:data:`LIMIT` bytes in all. Ignored files a run leaves there stay while the machine is
warm, so a file too big for one run travels in parts over several (``split``), each
part carried by one run and the whole put together on the machine (``assemble``).
Wheels of the packages the machine lacks are unpacked into a folder on ``sys.path``
(``unpack_wheels``): a wheel is a zip of the installed files, so no pip and no index.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
import sys
import zipfile
from pathlib import Path

LIMIT = 64 * 2**20  # bytes per run: working tree + carried files
MIB = 2**20


class BudgetError(ValueError):
    """A run's payload does not fit :data:`LIMIT`."""


def tree_files(repo: Path) -> list[Path]:
    """The files a run takes from the working tree: tracked and untracked-but-not-ignored
    (``git ls-files``, read only), those that exist now."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=repo, check=True, capture_output=True).stdout
    files = {repo / p for p in out.decode("utf-8", "surrogateescape").split("\0") if p}
    return sorted(f for f in files if f.is_file() and not f.is_symlink())


def size_of(path: Path) -> int:
    """Bytes of a file, or of every file under a folder."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def check_budget(tree_bytes: int, carried: dict[str, int], limit: int = LIMIT) -> int:
    """Total bytes of one run (the tree plus ``carried``: ``{path: bytes}``); raises
    :class:`BudgetError` naming the sizes when it exceeds ``limit``."""
    total = tree_bytes + sum(carried.values())
    if total > limit:
        parts = ", ".join(f"{p} {b / MIB:.1f} MiB" for p, b in carried.items())
        raise BudgetError(f"payload of {total / MIB:.1f} MiB exceeds {limit / MIB:.0f} MiB: "
                          f"working tree {tree_bytes / MIB:.1f} MiB, carried: {parts or 'nothing'}")
    return total


def sha256(path: Path) -> str:
    with Path(path).open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def split(src: Path, dests: list[Path]) -> dict:
    """Cut ``src`` into ``len(dests)`` nearly equal parts, part i written as
    ``dests[i] / (src.name + ".partI")``. Returns the manifest: name, size and sha256 of
    the whole and of each part (``part``: path relative to its folder's parent)."""
    size = src.stat().st_size
    step = -(-size // len(dests))
    parts = []
    with src.open("rb") as f:
        for i, folder in enumerate(dests, 1):
            folder.mkdir(parents=True, exist_ok=True)
            out = folder / f"{src.name}.part{i}"
            data = f.read(step)
            out.write_bytes(data)
            parts.append({"part": f"{folder.name}/{out.name}", "bytes": len(data),
                          "sha256": hashlib.sha256(data).hexdigest()})
    return {"name": src.name, "bytes": size, "sha256": sha256(src), "parts": parts}


def assemble(manifest: dict, payload: Path, dest_dir: Path) -> tuple[Path | None, str]:
    """Put the file of ``manifest`` together from its parts under ``payload`` into
    ``dest_dir`` (kept there: a later run finds it whole). Returns ``(path, "")``, or
    ``(None, why)`` naming the parts missing or damaged."""
    dest = dest_dir / manifest["name"]
    whole = dest.is_file() and dest.stat().st_size == manifest["bytes"]
    if whole and sha256(dest) == manifest["sha256"]:
        return dest, ""
    missing = [p["part"] for p in manifest["parts"] if not (payload / p["part"]).is_file()]
    if missing:
        return None, f"parts not on this machine: {', '.join(missing)} (carry them in earlier runs)"
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    with tmp.open("wb") as out:
        for p in manifest["parts"]:
            out.write((payload / p["part"]).read_bytes())
    if sha256(tmp) != manifest["sha256"]:
        tmp.unlink()
        return None, "assembled file does not match its sha256: a part is damaged"
    tmp.rename(dest)
    return dest, ""


def wheel_fits(name: str) -> bool:
    """Whether a wheel file name is for this interpreter and machine (pure wheels always)."""
    tags = name[:-4].split("-")[-3:]  # python, abi, platform
    if tags[2] == "any":
        return True
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return tags[0] == py and platform.machine() in tags[2]


def unpack_wheels(wheels: Path, site: Path) -> list[str]:
    """Unpack every wheel under ``wheels`` that fits this interpreter and whose package
    is not importable already (its distribution name is its module's, as for the three
    shipped) into ``site``, and put ``site`` first on ``sys.path``; returns the wheels
    unpacked."""
    import importlib.util

    done = []
    for whl in sorted(Path(wheels).glob("*.whl")):
        module = whl.name.split("-")[0]
        if wheel_fits(whl.name) and importlib.util.find_spec(module) is None:
            with zipfile.ZipFile(whl) as z:
                z.extractall(site)
            done.append(whl.name)
    if done and str(site) not in sys.path:
        sys.path.insert(0, str(site))
    return done
