"""Files whose read would block though stat() calls them regular, and the pseudo
filesystems that hold them (a tester's ``assistd index /proc`` hung, as root, reading
``/proc/kmsg``: a 0-byte "regular" file whose read waits for the next kernel message).

Two guards, each tested on its own: the walk does not descend into a pseudo filesystem
(procfs, sysfs, devtmpfs...: :func:`storage.walk.pseudo_filesystem`), and
:func:`storage.walk.open_checked` reads without blocking, so a file that would block is
refused (``WOULD_BLOCK``) wherever it is found. Real /proc where the system has one (the
read of /proc/kmsg only as root: others may not open it); FIFOs are the other case of
a read that would block (tests/storage/test_report_counters.py, test_hostile_files.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import storage.walk
from storage.indexer import RepoIndexer, index_repository
from storage.walk import PSEUDO_FS, WOULD_BLOCK, Refused, iter_files, open_checked
from tests.conftest import make_repo

# A regression blocks in a read: the guard fails it instead of hanging the suite.
pytestmark = pytest.mark.timeout(120)

FP = "bytes-v1"
KMSG = Path("/proc/kmsg")

linux_proc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or storage.walk.pseudo_filesystem(Path("/proc")) is None,
    reason="needs Linux with procfs mounted at /proc")
kmsg_readable = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0 or not KMSG.exists(),
    reason="/proc/kmsg opens only as root, on Linux")


def tok(text):
    return list(text.encode("utf-8"))


@kmsg_readable
def test_open_checked_refuses_a_regular_file_whose_read_would_block():
    """/proc/kmsg is 'regular' and 0 bytes by stat(); a blocking read waits for the next
    kernel message. Opened by open_checked, the read is refused at once (any messages
    already queued are read first: then it would block)."""
    assert KMSG.stat().st_size == 0 and KMSG.is_file()
    with pytest.raises(Refused) as err:
        with open_checked(KMSG, follow=True) as f:
            while f.read(4096):
                pass
    assert err.value.reason == WOULD_BLOCK


@kmsg_readable
def test_indexing_a_folder_holding_kmsg_finishes_and_counts_it(store, monkeypatch):
    """The read guard alone (the pseudo-filesystem check switched off): indexing the top
    of /proc, not recursively, ends and counts /proc/kmsg as a read that would block."""
    monkeypatch.setattr(storage.walk, "pseudo_filesystem", lambda path, parent_dev=None: None)
    report = index_repository(store, Path("/proc"), tok, FP, recursive=False, max_bytes=4096)
    assert report.refused.get(WOULD_BLOCK) == 1, report.refused


@linux_proc
def test_indexing_proc_is_refused_at_once_and_counted(store):
    """`assistd index /proc`: nothing under it is opened; the scope is counted once as a
    pseudo filesystem, and the pass ends with no document."""
    report = index_repository(store, Path("/proc"), tok, FP)
    assert report.refused == {PSEUDO_FS: 1}
    assert report.documents == 0 and report.tokenized == 0


def test_a_pseudo_filesystem_mounted_inside_a_repository_is_not_walked(store, tmp_path,
                                                                       monkeypatch):
    """A mount of a pseudo filesystem below the root (as /proc is below /) is not
    descended into: counted once, its files never listed; the rest is indexed.
    (Mounting needs privileges: ``pseudo_filesystem`` names the mount here.)"""
    repo = make_repo(tmp_path / "r", {"a.py": "x = 1\n", "proc/kmsg": "never read\n",
                                      "proc/sub/b.py": "never read\n", "src/c.py": "y = 2\n"})
    mount = repo / "proc"
    real = storage.walk.pseudo_filesystem
    monkeypatch.setattr(storage.walk, "pseudo_filesystem",
                        lambda path, parent_dev=None: "proc" if Path(path) == mount
                        else real(path, parent_dev))
    assert [rel for rel, _ in iter_files(repo)] == ["a.py", "src/c.py"]
    report = index_repository(store, repo, tok, FP)
    assert report.refused == {PSEUDO_FS: 1}
    assert report.documents == 2
    # A watcher's event for a path under the mount: not walked there either.
    assert RepoIndexer(store, repo, tok, FP).update(["proc"]).refused == {PSEUDO_FS: 1}
