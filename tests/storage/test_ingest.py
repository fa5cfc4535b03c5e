"""Transcript ingestion into a real SQLite history: tailing, resuming, rewrites, scopes.

Small hand-made Claude Code style sessions are written in the tests; the real
fixtures of ../shared are used where they exercise resuming (the codemie
incremental sessions are byte prefixes of one another).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from storage.ingest import TranscriptIngester, ingest_paths
from storage.store import HistoryStore
from tests.conftest import FIXTURES, make_repo, needs_fixtures

FP = "bytes-v1"


def tok(text):
    return list(text.encode("utf-8"))


def claude_line(i, text, cwd, msg=None):
    return json.dumps({
        "type": "assistant", "cwd": str(cwd), "uuid": f"u{i}", "sessionId": "s",
        "message": {"id": msg or f"msg_{i}", "role": "assistant",
                    "content": [{"type": "text", "text": text}]},
    }) + "\n"


def records(store, source=None):
    q = "select record_key, text, scope from documents where source_kind = 'transcript'"
    args = []
    if source is not None:
        q += " and source = ?"
        args.append(str(source))
    return {k: (t, s) for k, t, s in store.db.execute(q + " order by ordinal", args)}


def texts(store):
    return [t for t, _ in records(store).values()]


@pytest.fixture
def ing(store):
    return TranscriptIngester(store, tok, FP)


def test_partial_last_line_waits_then_completes(ing, store, tmp_path):
    """A transcript's half-written last line is left for later; once the rest is appended the
    next ingest takes it (one record), and a third ingest finds the file unchanged."""
    f = tmp_path / "s.jsonl"
    full = claude_line(1, "second", tmp_path)
    f.write_text(claude_line(0, "first", tmp_path) + full[:30])
    r = ing.ingest(f)
    assert texts(store) == ["first"] and r.records_put == 1
    with open(f, "a") as fh:
        fh.write(full[30:])
    r = ing.ingest(f)
    assert texts(store) == ["first", "second"] and r.records_put == 1
    assert ing.ingest(f).unchanged == 1


def test_complete_json_without_newline_is_taken_once(ing, store, tmp_path):
    """A complete JSON record without its newline is stored once, not again when the newline and
    the next record arrive."""
    f = tmp_path / "s.jsonl"
    f.write_text(claude_line(0, "first", tmp_path).rstrip("\n"))
    ing.ingest(f)
    with open(f, "a") as fh:
        fh.write("\n" + claude_line(1, "second", tmp_path))
    ing.ingest(f)
    assert texts(store) == ["first", "second"]


def test_grouped_response_across_passes_is_one_record(ing, store, tmp_path):
    """Claude Code writes one response as several lines sharing message.id; lines that
    arrive in a later pass still join the same record."""
    f = tmp_path / "s.jsonl"
    f.write_text(claude_line(0, "part one", tmp_path, msg="msg_A"))
    ing.ingest(f)
    with open(f, "a") as fh:
        fh.write(claude_line(1, "part two", tmp_path, msg="msg_A"))
        fh.write(claude_line(2, "part two", tmp_path, msg="msg_A"))  # duplicated block
    r = ing.ingest(f)
    assert texts(store) == ["part one\npart two"]
    assert r.skipped_duplicate == 1


def test_truncated_or_rewritten_file_is_read_again(ing, store, tmp_path):
    """A transcript that shrank, or kept its length but changed its head, counts as rewritten:
    its old records are replaced by the new file's."""
    f = tmp_path / "s.jsonl"
    f.write_text("".join(claude_line(i, f"old {i}", tmp_path) for i in range(3)))
    ing.ingest(f)
    f.write_text(claude_line(0, "new 0", tmp_path))  # shorter: truncated and rewritten
    r = ing.ingest(f)
    assert texts(store) == ["new 0"] and r.rewritten == 1
    # Same length, different head: rewritten too.
    f.write_text(claude_line(0, "NEW 0", tmp_path))
    assert ing.ingest(f).rewritten == 1
    assert texts(store) == ["NEW 0"]


def test_records_are_scoped_by_their_cwd(ing, store, tmp_path):
    """A record's scope is the git root of its cwd (as `assistd index` names it); a cwd
    that is not on this machine stays as written; no cwd falls back to the folder."""
    repo = make_repo(tmp_path / "proj", {"x.py": "x = 1\n"})
    (repo / "sub").mkdir()
    f = tmp_path / "s.jsonl"
    f.write_text(claude_line(0, "in repo", repo / "sub")
                 + claude_line(1, "elsewhere", "/nonexistent/other/../proj2")
                 + json.dumps({"role": "assistant", "content": "x"}) + "\n")
    ing.ingest(f)
    scopes = {t: s for t, s in records(store).values()}
    assert scopes["in repo"] == str(repo.resolve())
    assert scopes["elsewhere"] == "/nonexistent/proj2"


def test_vanished_transcript_keeps_its_records(ing, store, tmp_path):
    """A transcript deleted from disk is counted as vanished and its stored records stay."""
    f = tmp_path / "s.jsonl"
    f.write_text(claude_line(0, "kept", tmp_path))
    ing.ingest(f)
    f.unlink()
    assert ing.ingest(f).vanished == 1
    assert texts(store) == ["kept"]


def test_unknown_content_is_counted_not_fatal(ing, store, tmp_path):
    """Plain text in a .jsonl and binary bytes in a .traj are each counted as unknown_format and
    store nothing."""
    f = tmp_path / "notes.jsonl"
    f.write_text("just some text\nnot json at all\n")
    assert ing.ingest(f).unknown_format == 1
    g = tmp_path / "broken.traj"
    g.write_bytes(b"\x00\x01\x02binary")
    assert ing.ingest(g).unknown_format == 1
    assert texts(store) == []


def _same_as_fresh(tmp_path, turn1: Path, turn2: Path):
    """Ingest turn-1, then let the file grow to turn-2 (a byte prefix of it) in a new
    ingester (a restart); the records equal a fresh ingest of turn-2."""
    data1, data2 = turn1.read_bytes(), turn2.read_bytes()
    assert data2.startswith(data1)
    live = tmp_path / "live" / turn2.name
    live.parent.mkdir()
    live.write_bytes(data1)
    a = HistoryStore(tmp_path / "a.db")
    TranscriptIngester(a, tok, FP).ingest(live)
    first = len(records(a))
    with open(live, "ab") as fh:
        fh.write(data2[len(data1):])
    TranscriptIngester(a, tok, FP).ingest(live)
    fresh = tmp_path / "fresh" / turn2.name
    fresh.parent.mkdir()
    fresh.write_bytes(data2)
    b = HistoryStore(tmp_path / "b.db")
    TranscriptIngester(b, tok, FP).ingest(fresh)
    got = {k: t for k, (t, _) in records(a).items()}
    want = {k: t for k, (t, _) in records(b).items()}
    a.close()
    b.close()
    return first, got, want


@needs_fixtures
@pytest.mark.parametrize("tool,stem", [("claude-code", "codemie__incremental-simple__turn-"),
                                       ("codex", "codemie__incremental__turn-")])
def test_resume_from_offset_equals_fresh_ingest(tmp_path, tool, stem):
    """Claude Code and Codex fixtures (tests/data/transcripts): ingesting turn 1 then, after a
    restart, the bytes turn 2 appended stores the same records as a fresh ingest of turn 2."""
    d = FIXTURES / tool
    first, got, want = _same_as_fresh(tmp_path, d / f"{stem}1.jsonl", d / f"{stem}2.jsonl")
    assert 0 < first < len(want)
    assert got == want


@needs_fixtures
def test_all_fixtures_ingest_without_errors(store, tmp_path):
    """Every real fixture folder ingests; each file's format is detected from content."""
    r = ingest_paths(store, [FIXTURES], tok, FP)
    assert r.records_put > 0
    # schemas/ holds JSON schemas and READMEs: not transcripts, detected as such.
    assert set(r.formats) >= {"claude_code", "codex", "aider", "gemini_json", "swe_agent",
                              "mini_swe_agent", "openhands"}
    again = ingest_paths(store, [FIXTURES], tok, FP)
    assert again.records_put == 0 and again.unchanged == r.files


def test_whole_json_file_change_replaces_its_records(ing, store, tmp_path):
    """A whole-JSON transcript (mini-swe-agent) is re-read on change; a message that
    disappeared is forgotten, unchanged ones are not rewritten."""
    f = tmp_path / "run.traj.json"

    def write(msgs):
        f.write_text(json.dumps({"info": {}, "trajectory_format": "mini-swe-agent-1",
                                 "messages": [{"role": "system", "content": "sys"}] + msgs}))

    a = {"role": "assistant", "content": "THOUGHT: one\n```bash\nls\n```"}
    b = {"role": "assistant", "content": "THOUGHT: two\n```bash\npwd\n```"}
    write([a, {"role": "user", "content": "out"}, b])
    ing.ingest(f)
    assert len(texts(store)) == 2
    os.utime(f, ns=(1, 1))  # make sure the change is visible whatever the clock
    write([a])
    r = ing.ingest(f)
    assert len(texts(store)) == 1 and r.records_removed == 1 and r.records_put == 0


def test_pass_interrupted_between_chunks_resumes_exactly(store, tmp_path, monkeypatch):
    """A pass that dies after committing some chunks of a long file (here the tokenizer
    raises on one record, as a kill would stop it) leaves a state that the next pass
    resumes from: the final records equal an uninterrupted ingest, none lost or doubled."""
    import storage.ingest as ingest_mod

    f = tmp_path / "long.jsonl"
    f.write_text("".join(json.dumps({"role": "assistant", "content": f"answer number {i} " * 20})
                         + "\n" for i in range(300)))
    monkeypatch.setattr(ingest_mod, "CHUNK_BYTES", 20_000)

    class Killed(Exception):
        pass

    def dying(text):
        if text.startswith("answer number 150 "):
            raise Killed
        return tok(text)

    with pytest.raises(Killed):
        TranscriptIngester(store, dying, FP).ingest(f)
    partial = len(records(store))
    assert 0 < partial < 300
    TranscriptIngester(store, tok, FP).ingest(f)
    assert texts(store) == [f"answer number {i} " * 20 for i in range(300)]


def test_oversized_records_lines_and_archives_are_skipped_and_counted(store, tmp_path,
                                                                      monkeypatch):
    """A record over max_record_bytes, a line over MAX_LINE_BYTES and a .zst that inflates
    past MAX_WHOLE_BYTES (a decompression bomb) are each skipped and counted; the records
    around them are kept (newcomer report: a 1 GiB .zst line ended in bad_alloc)."""
    import zstandard

    import storage.ingest as ingest_mod

    monkeypatch.setattr(ingest_mod, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(ingest_mod, "MAX_LINE_BYTES", 16384)
    monkeypatch.setattr(ingest_mod, "MAX_WHOLE_BYTES", 100_000)
    ing = TranscriptIngester(store, tok, FP, max_record_bytes=2000)
    f = tmp_path / "s.jsonl"
    f.write_text(claude_line(0, "small before", tmp_path)
                 + claude_line(1, "y" * 5000, tmp_path)  # record over 2,000 bytes
                 + claude_line(2, "z" * 40_000, tmp_path)  # line over 16 KiB
                 + claude_line(3, "small after", tmp_path))
    r = ing.ingest(f)
    assert texts(store) == ["small before", "small after"]
    assert r.skipped_large == 2
    bomb = tmp_path / "rollout.jsonl.zst"
    line = (json.dumps({"role": "assistant", "content": "hi"}) + "\n"
            + json.dumps({"role": "assistant", "content": "x" * 200_000}) + "\n")
    bomb.write_bytes(zstandard.ZstdCompressor().compress(line.encode()))
    assert bomb.stat().st_size < 2000
    r = ing.ingest(bomb)  # read as if cut at the cap: the record before it is kept
    assert r.skipped_large == 1 and r.truncated == {ingest_mod.OVER_WHOLE: 1}
    assert sorted(texts(store)) == ["hi", "small after", "small before"]


def test_gemini_sessions_join_the_repository_whose_root_they_hash(store, tmp_path):
    """Gemini CLI records no cwd; its folder ~/.gemini/tmp/<sha256(project root)>/chats
    names the project, so the records join that indexed repository's scope."""
    import hashlib

    from storage.indexer import index_repository

    repo = make_repo(tmp_path / "proj", {"a.py": "a = 1\n"})
    index_repository(store, repo, tok, FP)
    root = str(repo.resolve())
    chats = tmp_path / "gemini" / "tmp" / hashlib.sha256(root.encode()).hexdigest() / "chats"
    chats.mkdir(parents=True)
    session = chats / "session-1.json"
    session.write_text(json.dumps({"sessionId": "s1", "projectHash": chats.parent.name,
                                   "messages": [{"id": "m1", "type": "gemini",
                                                 "content": "Here is the plan."}]}))
    r = TranscriptIngester(store, tok, FP).ingest(session)
    assert r.formats == {"gemini_json": 1}
    assert [s for _, s in records(store).values()] == [root]
