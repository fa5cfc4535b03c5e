"""Whether a process is still there: the editor a language server serves, the parent of
the pipe between an editor and the daemon."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """True while process ``pid`` exists (another user's counts: signal 0 is refused to
    us, not to it).

    >>> process_alive(os.getpid())
    True
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def exit_when_orphaned(poll_s: float = 0.5, code: int = 1) -> None:
    """End this process (``os._exit(code)``) soon after its parent dies, even in the
    middle of work: a helper process (the bench's numerics companion) otherwise keeps
    decoding until its current request is done, tens of seconds after a ``kill -9`` of
    the process that started it. A daemon thread compares ``os.getppid()`` every
    ``poll_s`` seconds; an orphan is re-parented, so its parent pid changes.
    (Linux's ``PR_SET_PDEATHSIG`` does this without polling, but not on macOS.)"""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(code)

    threading.Thread(target=watch, name="exit-when-orphaned", daemon=True).start()
