"""The MCP tool apply_edit, driven by the official MCP client over stdio against a real
``assistd mcp --no-daemon`` process: blocks applied without the model, refusals as tool
errors, and a lazy snippet merged by the in-process Target with the file as prediction."""

from __future__ import annotations

import anyio

from tests.conftest import make_repo, on_remote_target
from tests.serving.test_mcp import TEST_TIMEOUT_S, _env, _ok, _text, mcp_session

CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
BLOCK = "calc.py\n```python\n<<<<<<< SEARCH\n    return a - b\n=======\n" \
        "    return a - b  # minus\n>>>>>>> REPLACE\n```\n"


async def test_apply_edit_tool_applies_blocks_refuses_files_and_merges_snippets(tmp_path):
    """Without a daemon: blocks come back as a diff (a path relative to the server's
    working directory) and as text, the file untouched; a .env file, a missing SEARCH and
    a repo that is not a directory are tool errors naming the cause; a
    lazy snippet is merged by the in-process model (loaded then), with OpenAI's
    prediction counts in usage (on a remote Target: the path runs, counts not judged)."""
    repo = make_repo(tmp_path / "proj", {"calc.py": CALC, ".env": "KEY=1\n"})
    env = _env(tmp_path, tmp_path / "no-daemon.sock", tmp_path / "history.db")
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with mcp_session(tmp_path, env, "--no-daemon") as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            schema = tools["apply_edit"].input_schema
            assert schema["required"] == ["path", "edit"]
            assert {"instruction", "output", "repo"} <= set(schema["properties"])
            assert "SEARCH" in tools["apply_edit"].description

            out = _ok(await s.call_tool("apply_edit", {"path": "proj/calc.py", "edit": BLOCK}),
                      tmp_path)
            assert out["method"] == "search_replace" and out["path"] == "calc.py"
            assert out["diff"].startswith("--- a/calc.py\n+++ b/calc.py\n")
            assert "+    return a - b  # minus" in out["diff"] and out["text"] is None
            assert out["blocks"] == [{"index": 1, "match": "exact", "line": 6, "indent": ""}]
            text = _ok(await s.call_tool("apply_edit", {
                "path": str(repo / "calc.py"), "edit": BLOCK, "output": "text"}), tmp_path)
            assert text["text"] == CALC.replace("a - b\n", "a - b  # minus\n")
            assert (repo / "calc.py").read_text() == CALC

            r = await s.call_tool("apply_edit", {"path": str(repo / ".env"), "edit": BLOCK})
            assert r.is_error and "ignore rules exclude it" in _text(r)
            r = await s.call_tool("apply_edit", {"path": str(repo / "calc.py"),
                                                 "edit": BLOCK.replace("a - b\n=", "a * b\n=")})
            assert r.is_error and "block 1 (line 3 of the edit)" in _text(r)
            assert "matches nothing in calc.py" in _text(r)
            r = await s.call_tool("apply_edit", {"path": "calc.py", "edit": BLOCK,
                                                 "repo": str(tmp_path / "elsewhere")})
            assert r.is_error and "is not a directory" in _text(r)

            snippet = "def add(a, b):\n    return a + b + 0\n# ... existing code ...\n"
            out = _ok(await s.call_tool("apply_edit", {
                "path": str(repo / "calc.py"), "edit": snippet, "output": "text",
                "instruction": "add zero"}), tmp_path)
            assert out["method"] == "model" and out["text"]
            assert out["lazy_markers"] == [{"line": 3, "text": "# ... existing code ..."}]
            details = out["usage"]["completion_tokens_details"]
            if not on_remote_target():
                assert details["accepted_prediction_tokens"] > 0
            assert (repo / "calc.py").read_text() == CALC
