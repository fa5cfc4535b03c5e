"""assistd: a local coding-assistant backend.

One engine, many front ends: history -> proposers -> Target -> verification -> ledger.
"""

__version__ = "0.1.0"
