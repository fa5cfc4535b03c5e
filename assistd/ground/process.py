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
