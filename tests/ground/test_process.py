"""Helper processes end with the process that started them."""

import os
import signal
import subprocess
import sys

ORPHAN = ("import sys, time; from assistd.ground.process import exit_when_orphaned;"
          "exit_when_orphaned(0.05, code=3); print('ready', flush=True); time.sleep(600)")


def test_a_helper_exits_when_its_parent_is_killed():
    """A parent killed with SIGKILL leaves its helper re-parented; the helper notices and
    exits instead of sleeping out its 600 s. The helper holds the pipe's write end, so
    end-of-file on the read end is the helper's own exit (a zombie's pid would still
    answer a signal-0 probe where PID 1 does not reap)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time;"
         f"subprocess.Popen([sys.executable, '-c', {ORPHAN!r}]); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    assert parent.stdout.readline().strip() == "ready"
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    # Blocks until every writer is gone: the helper has exited (600 s later without the
    # watch; pytest-timeout's backstop would fail the test long before).
    assert parent.stdout.read() == ""
