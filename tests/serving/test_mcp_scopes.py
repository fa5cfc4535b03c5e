"""Issue 34 (hardening), class 7: MCP ``acceptance_stats`` listed every scope's path to
any agent (a break-it pass). Now it names no scope the agent did not name itself: the
figures over all scopes come with how many scopes they cover, and a scope with no data
is an error that lists no other one.

Real parts: `assistd mcp --no-daemon` driven by the official MCP client, a real SQLite
history holding real ledger rows of two repositories."""

from __future__ import annotations

import json

import anyio

from assistd.ground.ledger import Ledger
from storage.ledger_store import LedgerStore
from storage.store import HistoryStore
from tests.conftest import make_repo
from tests.serving.test_mcp import _env, _ok, _text, mcp_session

TARGET = "llama:smollm2.gguf:100:cpu:t2"


def _ledger(rounds: int) -> Ledger:
    led = Ledger()
    for _ in range(rounds):
        led.record_round(4, 2, ceiling=4, draft_ms=0.1, verify_ms=20.0)
    led.record_plain_step(proposed=True, draft_ms=0.05, verify_ms=11.0)
    return led


async def test_acceptance_stats_names_no_scope_the_agent_did_not_name(tmp_path):
    """MCP acceptance_stats without a scope gives languages and a scope count but no scope
    paths; with the agent's own scope, that scope only; an unknown scope is an error that names
    no other scope."""
    mine = make_repo(tmp_path / "my-project", {"a.py": "x = 1\n"})
    other = make_repo(tmp_path / "client-acme-secret-merger", {"b.py": "y = 2\n"})
    db = tmp_path / "history.db"
    store = HistoryStore(db)
    ledgers = LedgerStore(store)
    ledgers.add(str(mine), "python", "suffix", TARGET, _ledger(10))
    ledgers.add(str(other), "rust", "suffix", TARGET, _ledger(5))
    store.close()
    env = _env(tmp_path, tmp_path / "no-daemon.sock", db)
    with anyio.fail_after(300):
        async with mcp_session(tmp_path, env, "--no-daemon") as s:
            every = _ok(await s.call_tool("acceptance_stats", {}), tmp_path)
            text = json.dumps(every)
            assert "acme" not in text and "my-project" not in text
            assert every["scope"] is None and every["scope_count"] == 2
            assert "scopes" not in every
            assert {e["language"] for e in every["entries"]} == {"python", "rust"}

            own = _ok(await s.call_tool("acceptance_stats", {"scope": str(mine)}), tmp_path)
            assert own["scope"] == str(mine) and own["scope_count"] == 1  # it named it
            assert [e["language"] for e in own["entries"]] == ["python"]
            assert "acme" not in json.dumps(own)

            r = await s.call_tool("acceptance_stats", {"scope": str(tmp_path / "elsewhere")})
            assert r.is_error and "no ledger rows for scope" in _text(r)
            assert "acme" not in _text(r) and "my-project" not in _text(r)
