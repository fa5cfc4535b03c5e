"""Holes a break-it probe found in transcript ingest (issue 21): a zstd bomb, tool inputs
of the wrong JSON type, lone surrogates and non-UTF-8 lines, and refusals the daemon's
watcher batches did not report. Real files, real zstd archives (made here), a real
SQLite history, real inotify events; memory measured in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import zstandard

from storage.ingest import MAX_WHOLE_BYTES, OVER_WHOLE, TranscriptIngester
from storage.transcripts import parse_all, parser_for
from storage.walk import NOT_REGULAR
from tests.conftest import REPO

FP = "bytes-v1"


def tok(text):
    return list(text.encode("utf-8"))


def texts(store):
    return sorted(t for (t,) in store.db.execute("select text from documents"))


def claude(msg_id: str, *blocks, cwd: str = "/nowhere") -> str:
    return json.dumps({"type": "assistant", "uuid": f"u-{msg_id}", "sessionId": "s", "cwd": cwd,
                       "message": {"id": msg_id, "role": "assistant", "content": list(blocks)}}
                      ) + "\n"


def tool(name, tool_input, tid):
    return {"type": "tool_use", "id": tid, "name": name, "input": tool_input}


# -- a zstd bomb: bounded memory, the records before the cap kept -----------------------------

def _bomb(path, good: str, junk_frame: bytes, frames: int) -> int:
    """Write ``good`` then ``frames`` copies of the zstd frame ``junk_frame`` (a stream may
    hold several frames: all are read); returns the compressed size."""
    cctx = zstandard.ZstdCompressor()
    data = cctx.compress(good.encode()) + junk_frame * frames
    path.write_bytes(data)
    return len(data)


def test_a_zstd_bomb_keeps_its_records_before_the_cap_in_bounded_memory(tmp_path):
    """A ~100 KB ``.jsonl.zst`` decompressing to 1.5 GB of JSONL lines, and one to 1.5 GB
    with no newline at all (one endless line). Each is read as if cut at the cap
    (``decompressed past 256 MB``, counted once), its good records stored; the peak RSS
    of the process (VmHWM after a reset, in a fresh interpreter) grows by about the one
    64 MiB line held, far under the cap (it grew by 790 MB, from 200 MB to 990 MB)."""
    good = "".join(claude(f"m{i}", {"type": "text", "text": f"good record {i}"}) for i in range(3))
    cctx = zstandard.ZstdCompressor()
    # 64 lines of 1 MiB: a record type that carries no model text, as a runaway log would.
    line = json.dumps({"type": "progress", "uuid": "p", "sessionId": "s", "data": "A" * (1 << 20)})
    lines_frame = cctx.compress((line + "\n").encode() * 64)
    sizes = {
        "lines": _bomb(tmp_path / "lines.jsonl.zst", good, lines_frame, 24),
        "endless": _bomb(tmp_path / "endless.jsonl.zst", good,
                         cctx.compress(b"A" * (64 << 20)), 24),
    }
    assert max(sizes.values()) < 200_000, sizes  # 1.5 GB each once decompressed
    code = textwrap.dedent(f"""
        import json, resource
        from pathlib import Path

        def peak_kib():  # VmHWM: ru_maxrss would carry the forking parent's peak
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

        from storage.ingest import TranscriptIngester
        from storage.store import HistoryStore
        store = HistoryStore(Path({str(tmp_path / "h.db")!r}))
        ing = TranscriptIngester(store, lambda s: list(s.encode()), "fp")
        try:  # reset the peak to the current RSS (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        before = peak_kib()
        out = {{}}
        for name in ("lines", "endless"):
            r = ing.ingest(Path({str(tmp_path)!r}) / (name + ".jsonl.zst"))
            texts = sorted(t for (t,) in store.db.execute(
                "select text from documents where source like ?", ["%" + name + "%"]))
            out[name] = {{"truncated": r.truncated, "skipped_large": r.skipped_large,
                          "texts": texts, "files": r.files}}
        out["again"] = ing.ingest(Path({str(tmp_path)!r}) / "lines.jsonl.zst").unchanged
        after = peak_kib()
        out["rss_kib"] = [before, after]
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    want = [f"good record {i}" for i in range(3)]
    for name in ("lines", "endless"):
        assert out[name]["texts"] == want, name
        assert out[name]["truncated"] == {OVER_WHOLE: 1} and out[name]["files"] == 1, name
    assert out["lines"]["skipped_large"] == 0
    assert out["endless"]["skipped_large"] == 1  # the endless line, dropped at 64 MiB
    assert out["again"] == 1  # the stored state is complete: the next pass does nothing
    before, after = out["rss_kib"]
    grown = (after - before) >> 10
    print(f"bomb: peak RSS {before >> 10} MiB before, {after >> 10} MiB after ({grown} MiB)")
    assert grown < (MAX_WHOLE_BYTES >> 20) + 150  # generous: measured 70 MiB


def test_a_small_zst_past_a_lowered_cap_is_cut_between_records(store, tmp_path, monkeypatch):
    """The cut falls inside a line: the records of the complete lines before it are kept,
    the cut line is not fed (it is incomplete), the rest is never decompressed."""
    import storage.ingest as ingest_mod

    body = "".join(claude(f"m{i}", {"type": "text", "text": f"answer {i}"}) for i in range(100))
    path = tmp_path / "s.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(body.encode()))
    cap = len(body) // 2
    monkeypatch.setattr(ingest_mod, "MAX_WHOLE_BYTES", cap)
    r = TranscriptIngester(store, tok, FP).ingest(path)
    kept = body[:cap].count("\n")
    assert r.truncated == {OVER_WHOLE: 1} and r.records_put == kept
    assert texts(store) == sorted(f"answer {i}" for i in range(kept))


# -- tool inputs of the wrong type: skipped and counted, never stored as "null" -------------

def test_claude_tool_inputs_of_the_wrong_type_are_skipped_and_counted(store, tmp_path):
    """``"input": null``, an Edit whose new_string is 7, a Write whose content is a list,
    a MultiEdit whose edits are an object: each call counted as malformed; the text
    block on the same line and the well-typed calls (their JSON, as before) are kept."""
    path = tmp_path / "s.jsonl"
    path.write_text(
        claude("m1", {"type": "text", "text": "prose kept"}, tool("Bash", None, "t1"))
        + claude("m2", tool("Edit", {"file_path": "a.py", "new_string": 7}, "t2"))
        + claude("m3", tool("Write", {"file_path": "a.py", "content": ["x"]}, "t3"))
        + claude("m4", tool("MultiEdit", {"file_path": "a.py", "edits": {"new_string": "x"}},
                            "t4"))
        + claude("m5", tool("Bash", 7, "t5"), tool("Bash", [1], "t6"))
        + claude("m6", tool("Bash", {"command": "ls"}, "t7"),
                 tool("Edit", {"file_path": "a.py", "new_string": "x = 1"}, "t8"),
                 tool("MultiEdit", {"file_path": "a.py", "edits": [{"new_string": "y"}]}, "t9")))
    r = TranscriptIngester(store, tok, FP).ingest(path)
    assert texts(store) == sorted(["prose kept", '{"command": "ls"}', "x = 1", "y"])
    assert r.skipped_malformed == 6
    assert "null" not in texts(store) and "7" not in texts(store)


def test_gemini_codex_and_others_skip_wrongly_typed_calls(tmp_path):
    """The same across parsers: Gemini ``toolCalls: [7]``, args missing or null, a replace
    whose new_string is 7; Codex ``arguments`` 7 or the string "null"; mini-swe-agent
    arguments null; an OpenHands MCP call whose arguments are a list."""
    gemini = {"sessionId": "s", "projectHash": "h", "messages": [
        {"id": "m1", "type": "gemini", "content": "said", "toolCalls": [
            7, {"id": "c1", "name": "read_file"}, {"id": "c2", "name": "x", "args": None},
            {"id": "c3", "name": "replace", "args": {"file_path": "a.ts", "new_string": 7}},
            {"id": "c4", "name": "read_file", "args": {"file_path": "a.ts"}}]}]}
    p = parser_for("gemini_json")
    ops = parse_all(p, json.dumps(gemini).encode())
    assert [op.text for op in ops] == ["said", '{"file_path": "a.ts"}']
    assert p.stats.skipped_malformed == 4

    def codex(args, cid):
        return json.dumps({"timestamp": "t", "type": "response_item", "payload": {
            "type": "function_call", "name": "shell", "arguments": args, "call_id": cid}})
    p = parser_for("codex")
    lines = [codex(7, "a"), codex("null", "b"), codex("[1]", "c"), codex(None, "d"),
             codex('{"command": ["bash", "-lc", "ls"]}', "e"), codex({"command": "pwd"}, "f")]
    ops = parse_all(p, "\n".join(lines).encode())
    assert [op.text for op in ops] == ["ls", "pwd"] and p.stats.skipped_malformed == 4

    mini = {"info": {"mini_version": "1"}, "trajectory_format": "mini-swe-agent-1", "messages": [
        {"role": "assistant", "content": "t", "tool_calls": [
            {"id": "c", "function": {"name": "bash", "arguments": None}},
            {"id": "d", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]}]}
    p = parser_for("mini_swe_agent")
    assert "ls" in [op.text for op in parse_all(p, json.dumps(mini).encode())]
    assert not any(op.text == "null" for op in parse_all(parser_for("mini_swe_agent"),
                                                          json.dumps(mini).encode()))
    assert p.stats.skipped_malformed == 1

    hands = [{"id": 1, "source": "agent", "action": "call_tool_mcp",
              "args": {"name": "x", "arguments": [1, 2]}},
             {"id": 2, "source": "agent", "action": "call_tool_mcp",
              "args": {"name": "x", "arguments": {"q": 1}}}]
    p = parser_for("openhands")
    assert [op.text for op in parse_all(p, json.dumps(hands).encode())] == ['{"q": 1}']
    assert p.stats.skipped_malformed == 1


# -- text: one U+FFFD per lone surrogate; lines decoded with replacement are counted --------

def test_a_lone_surrogate_is_one_replacement_character(store, tmp_path):
    """Each lone surrogate escape in a JSON transcript becomes one U+FFFD; an escaped surrogate
    pair stays the emoji it encodes."""
    path = tmp_path / "chat.jsonl"
    path.write_text('{"role": "assistant", "content": "a\\ud800b \\udfff c"}\n'
                    '{"role": "assistant", "content": "pair \\ud83d\\ude00 kept"}\n')
    TranscriptIngester(store, tok, FP).ingest(path)
    assert texts(store) == ["a\ufffdb \ufffd c", "pair \U0001f600 kept"]


def test_lines_that_are_not_utf8_are_counted_and_shown_by_index(tmp_path):
    """A JSONL transcript with two lines holding a byte that is not UTF-8: stored with
    U+FFFD, counted in ``decoded_with_replacement``, shown by `assistd index` (real CLI,
    real model) as repository files are."""
    path = tmp_path / "chat.jsonl"
    path.write_bytes(b'{"role": "assistant", "content": "caf\xe9"}\n'
                     b'{"role": "assistant", "content": "fine"}\n'
                     b'{"role": "assistant", "content": "\xff\xfe"}\n')
    env = dict(os.environ, ASSISTD_DB=str(tmp_path / "cli.db"))
    args = [sys.executable, "-m", "assistd", "index", "--transcripts", str(path)]
    proc = subprocess.run(args + ["--json"], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["transcripts"]
    assert report["decoded_with_replacement"] == 2 and report["records_put"] == 3
    path.write_bytes(path.read_bytes() + b'{"role": "assistant", "content": "\xc3"}\n')
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "1 decoded with replacement" in proc.stdout  # this pass read one new line


# -- the watcher's batches count refusals as the initial scan does ---------------------------

def test_a_watcher_batch_counts_the_fifo_in_a_folder_moved_in(tmp_path, store):
    """A folder holding a FIFO named like a transcript, moved into a watched transcript
    folder (real inotify events): the batch counts the FIFO by reason, and stores the
    transcript beside it."""
    from storage.watcher import HistoryWatcher

    watched = tmp_path / "sessions"
    watched.mkdir()
    staged = tmp_path / "staged"
    staged.mkdir()
    os.mkfifo(staged / "pipe.jsonl")
    (staged / "chat.jsonl").write_text('{"role": "assistant", "content": "kept"}\n')
    w = HistoryWatcher(store, tok, FP, transcripts=[watched])
    w.start()
    try:
        w.scan()
        os.rename(staged, watched / "moved")
        refused, deadline = {}, time.monotonic() + 60
        while not texts(store) and time.monotonic() < deadline:
            batch = w.process_batch(timeout=1)
            if batch is not None:
                for reason, n in batch.transcripts.refused.items():
                    refused[reason] = refused.get(reason, 0) + n
    finally:
        w.stop()
    assert texts(store) == ["kept"]
    assert refused.get(NOT_REGULAR, 0) >= 1


def test_the_daemons_last_batch_carries_the_skip_counts(tmp_path, target):
    """`assistd status --json`'s watcher.last_batch (WatcherThread.status, real model,
    real events) carries the batch's counts as initial_scan does: a FIFO and a transcript
    moved in are counted there, refused by reason and stored."""
    from assistd.serving.config import Config
    from assistd.serving.daemon import WatcherThread

    watched = tmp_path / "sessions"
    watched.mkdir()
    staged = tmp_path / "staged"
    staged.mkdir()
    os.mkfifo(staged / "pipe.jsonl")
    (staged / "chat.jsonl").write_text('{"role": "assistant", "content": "kept"}\n')
    config = Config(db=str(tmp_path / "d.db"), transcripts=[str(watched)],
                    agent_transcripts=False)
    w = WatcherThread(config, target.tokenize, target.fingerprint)
    w.start()
    try:
        deadline = time.monotonic() + 120
        while w.state != "watching" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert NOT_REGULAR not in w.status()["initial_scan"]["transcripts"]["refused"]
        os.rename(staged, watched / "moved")
        refused = {}
        while not refused.get(NOT_REGULAR) and time.monotonic() < deadline:
            batch = w.status()["last_batch"] or {}
            refused = batch.get("transcripts", {}).get("refused", {})
            time.sleep(0.05)
        assert refused.get(NOT_REGULAR, 0) >= 1
        assert "skipped_malformed" in w.status()["last_batch"]["transcripts"]
    finally:
        w.stop()
