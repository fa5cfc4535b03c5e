"""This machine's loopback names: the hosts the daemon listens on without
``allow_remote``, and the only ``Host`` (or ``Origin`` host) its HTTP API answers."""

from __future__ import annotations

# Names as a user writes them in ``--tcp HOST:PORT`` and as ``api.host_name`` reduces a
# Host header (lower case, no port, no IPv6 brackets). 127.0.0.0/8 beyond .1 is left out
# on purpose: what a listener means by "loopback only" must be one short list.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
