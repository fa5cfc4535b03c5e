"""Transcript parsers (storage/transcripts): model output as records, no database.

Real transcripts are read IN PLACE from ../shared/fixtures/transcripts (skipped with
the reason when absent, never copied here). Edge cases use the hand-made files in
tests/data/transcripts/ and small documents built inline.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import zstandard

from assistd.ground.errors import InputError
from storage.transcripts import (
    ASSISTANT, FORMATS, HEAD_BYTES, TOOL_INPUT, Append, LineParser, Put, Rewind,
    TranscriptError, WholeParser, apply_ops, detect_format, open_bytes, parse_all, parser_for,
)
from tests.conftest import FIXTURES, needs_fixtures

DATA = Path(__file__).resolve().parents[1] / "data" / "transcripts"

# (fixture, format, assistant records, tool_input records). Counted by hand, independently
# of the parsers:
#  claude-code: distinct message ids with a non-blank text block + distinct tool_use ids:
#    jq -r 'select(.type=="assistant") | (.message.id // .uuid) as $m | .message.content[]
#           | select(.type=="text" and (.text|test("\\S"))) | $m' F | sort -u | wc -l
#    jq -r 'select(.type=="assistant") | .message.content[] | select(.type=="tool_use") | .id' F
#       | sort -u | wc -l
#  codex: jq -c 'select(.type=="response_item" and .payload.type=="message"
#                and .payload.role=="assistant")' F | wc -l            (assistant)
#         jq -r 'select(.type=="response_item" and (.payload.type=="function_call"
#                or .payload.type=="custom_tool_call")) | .payload.call_id' F | sort -u | wc -l
#  gemini: jq '[.messages[]|select(.type=="gemini" and (.content|test("\\S")))]|length' F  -> 3
#          jq '[.messages[]|select(.type=="gemini")|.toolCalls[]?|.id]|unique|length' F     -> 10
#  swe-agent: jq '[.trajectory[]|select(.thought|test("\\S"))]|length' F -> 11, same for .action
#  mini-swe-agent: jq '[.messages[]|select(.role=="assistant" and (.content|test("\\S")))]|length'
#  openhands: 2 agent actions with a thought (edit, finish) + the edit's file text -> 2 + 1
#  aider: maximal blocks of unmarked lines, by this awk (same rules as aider.py's docstring,
#    written separately): 402 blocks in 515 runs
#    awk '{ sub(/\r$/, "") }
#         intool { if ($0 ~ /[^ \t]  $/) intool=0; if ($0 !~ /^# aider chat started at /) next }
#         /^# aider chat started at / { inrep=0; next }
#         /^#### .*  $/ { inrep=0; next }
#         /^> / { inrep=0; if ($0 !~ /  $/) intool=1; next }
#         /^[ \t]*$/ { next }
#         { if (!inrep) { n++; inrep=1 } } END { print n }' F
REAL = [
    ("claude-code/codemie__incremental-simple__turn-1.jsonl", "claude_code", 1, 0),
    ("claude-code/codemie__incremental-simple__turn-2.jsonl", "claude_code", 6, 2),
    ("claude-code/codemie__session-9eda1058.jsonl", "claude_code", 5, 3),
    ("claude-code/daaain__representative_messages.synthetic.jsonl", "claude_code", 3, 2),
    ("claude-code/simonw__sample_session.jsonl", "claude_code", 2, 2),
    ("codex/codemie__incremental__turn-1.jsonl", "codex", 1, 0),
    ("codex/codemie__incremental__turn-2.jsonl", "codex", 2, 0),
    ("codex/codemie__rollout-2026-05-11T13-28-45-019e1695-0522-7c83-8b39-0dd379793f80.jsonl",
     "codex", 3, 38),
    ("gemini-cli/codemie__session-2025-12-01T21-45-5b959dae.json", "gemini_json", 3, 10),
    ("swe-agent/sweagent__demo__function_calling__marshmallow-1867.traj", "swe_agent", 11, 11),
    ("mini-swe-agent/django__django-16139.traj.json", "mini_swe_agent", 26, 0),
    ("openhands/openhands__basic.json", "openhands", 2, 1),
    ("aider/aider__tests_fixtures_chat-history.TRUNCATED.md", "aider", 402, 0),
]
CODEX_ROLLOUT = REAL[7][0]
IDS = [rel.split("/")[1][:40] for rel, *_ in REAL]

# Strings planted in the hand-made fixtures that must never reach a record.
BLOBS = ("iVBORw0KGgo", "EqQBCkYIBxgCKkBSIGNATURE", "REDACTEDBLOB", "ENCRYPTEDREASONING",
         "ORIGINAL-FILE-CONTENT", "THOUGHT-SUMMARY-TEXT", "secret chain of thought")
OWN = [("claude_edge.jsonl", "claude_code"), ("codex_edge.jsonl", "codex"),
       ("gemini_session.jsonl", "gemini_jsonl"), ("aider_edge.md", "aider"),
       ("generic.jsonl", "generic_jsonl")]


def lines_of(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    return lines[:-1] if lines and lines[-1] == b"" else lines


def parse(fmt: str, data: bytes):
    parser = parser_for(fmt)
    ops = parse_all(parser, data)
    return parser, ops, apply_ops(ops)


def feed_with_restarts(fmt: str, lines: list[bytes], cuts: set[int]):
    """Feed lines, moving to a NEW parser through a JSON state round trip before each
    index in ``cuts`` (what a daemon restart does with the persisted state)."""
    parser, ops = parser_for(fmt), []
    for i, line in enumerate(lines):
        if i in cuts:
            state = json.loads(json.dumps(parser.state()))
            parser = parser_for(fmt)
            parser.load_state(state)
        ops.extend(parser.feed_line(line))
    return ops


# ---------------------------------------------------------------- real fixtures

@needs_fixtures
@pytest.mark.parametrize("rel,fmt,n_assistant,n_tool", REAL, ids=IDS)
def test_real_fixture_parses_to_hand_counted_records(rel, fmt, n_assistant, n_tool):
    """Each real transcript: detected from content, parsed with no exception and no
    malformed entry, and yields exactly the hand-counted records of each kind."""
    path = FIXTURES / rel
    assert detect_format(path, open_bytes(path, HEAD_BYTES)) == fmt
    parser, ops, records = parse(fmt, open_bytes(path))
    kinds = [r.kind for r in records.values()]
    assert (kinds.count(ASSISTANT), kinds.count(TOOL_INPUT)) == (n_assistant, n_tool)
    assert all(r.text.strip() for r in records.values())
    assert parser.stats.skipped_malformed == 0
    assert parser.stats.records == sum(not isinstance(op, Rewind) for op in ops)
    if isinstance(parser, LineParser):
        assert len(json.dumps(parser.state())) < 64 * 1024  # bounded resume state


@needs_fixtures
@pytest.mark.parametrize("rel,fmt", [(r[0], r[1]) for r in REAL], ids=IDS)
def test_real_fixture_detected_when_renamed(rel, fmt, tmp_path):
    """Detection reads content: a copy named x.txt is still recognised, from a 64 KiB
    head and from a 4 KiB one (the Codex rollout's first line alone is longer than that)."""
    copy = tmp_path / "x.txt"
    shutil.copyfile(FIXTURES / rel, copy)
    assert detect_format(copy, open_bytes(copy, HEAD_BYTES)) == fmt
    assert detect_format(copy, open_bytes(copy, 4096)) == fmt


@needs_fixtures
def test_real_fixture_cwd_and_languages():
    """Project directories come from the transcript itself; Write gets its file's language."""
    _, _, claude = parse("claude_code", (FIXTURES / REAL[2][0]).read_bytes())
    assert {r.cwd for r in claude.values()} == {"/Users/user/repo"}
    assert sorted(r.language_id for r in claude.values() if r.language_id) == ["markdown"]
    _, _, codex = parse("codex", (FIXTURES / CODEX_ROLLOUT).read_bytes())
    assert {r.cwd for r in codex.values()} == {"/Users/Sample_User/naya"}
    assert {r.language_id for r in codex.values() if r.kind == TOOL_INPUT} == {"shellscript", None}
    _, _, swe = parse("swe_agent", (FIXTURES / REAL[9][0]).read_bytes())
    assert {r.cwd for r in swe.values()} == {"/testbed"}
    _, _, mini = parse("mini_swe_agent", (FIXTURES / REAL[10][0]).read_bytes())
    assert {r.cwd for r in mini.values()} == {"/testbed"}
    _, _, oh = parse("openhands", (FIXTURES / REAL[11][0]).read_bytes())
    edit = oh["event3"]
    assert edit.language_id == "python" and edit.text.startswith("import random\n")


@needs_fixtures
def test_codex_zst_archive_decompressed_and_detected(tmp_path):
    """A .jsonl.zst rollout (with and without frame content size, one or several frames)
    reads back byte-identical, is detected as codex under any name, and parses the same."""
    raw = (FIXTURES / CODEX_ROLLOUT).read_bytes()
    single = tmp_path / "rollout-a.jsonl.zst"
    single.write_bytes(zstandard.ZstdCompressor().compress(raw))
    streamed = tmp_path / "archive.bin"  # stream-written frames carry no content size
    with open(streamed, "wb") as f:
        for part in (raw[:100_000], raw[100_000:]):
            with zstandard.ZstdCompressor().stream_writer(f, closefd=False) as w:
                w.write(part)
    for path in (single, streamed):
        assert open_bytes(path) == raw
        assert open_bytes(path, 1000) == raw[:1000]
        assert detect_format(path, open_bytes(path, HEAD_BYTES)) == "codex"
        _, _, records = parse("codex", open_bytes(path))
        assert len(records) == 41


@needs_fixtures
@pytest.mark.parametrize("tool,fmt", [("claude-code/codemie__incremental-simple__", "claude_code"),
                                      ("codex/codemie__incremental__", "codex")])
def test_incremental_turns_across_restart(tool, fmt):
    """turn-1 is a byte prefix of turn-2: feeding turn-1, persisting state, then feeding the
    rest of turn-2 into a NEW parser gives exactly the ops of feeding turn-2 at once."""
    turn1 = (FIXTURES / f"{tool}turn-1.jsonl").read_bytes()
    turn2 = (FIXTURES / f"{tool}turn-2.jsonl").read_bytes()
    assert turn2.startswith(turn1) and turn1.endswith(b"\n")
    first = parser_for(fmt)
    ops = [op for line in lines_of(turn1) for op in first.feed_line(line)]
    second = parser_for(fmt)
    second.load_state(json.loads(json.dumps(first.state())))
    ops += [op for line in lines_of(turn2[len(turn1):]) for op in second.feed_line(line)]
    _, at_once, records = parse(fmt, turn2)
    assert ops == at_once
    assert apply_ops(ops) == records


@needs_fixtures
def test_aider_real_history_across_restarts():
    """Restarting inside replies of the 1.9 MB aider log (every 997 lines) changes nothing."""
    data = (FIXTURES / REAL[-1][0]).read_bytes()
    lines = lines_of(data)
    _, at_once, records = parse("aider", data)
    ops = feed_with_restarts("aider", lines, set(range(997, len(lines), 997)))
    assert ops == at_once and apply_ops(ops) == records


@needs_fixtures
def test_real_fixture_blobs_never_indexed():
    """Claude thinking signatures and Codex encrypted reasoning never reach a record."""
    blobs = []
    for rel, _, _, _ in REAL[:5]:
        for line in lines_of((FIXTURES / rel).read_bytes()):
            rec = json.loads(line)
            content = (rec.get("message") or {}).get("content")
            for block in content if isinstance(content, list) else []:
                if block.get("signature"):
                    blobs.append(block["signature"][:40])
        text = "\n".join(r.text for r in parse("claude_code", (FIXTURES / rel).read_bytes())[2].values())
        assert not any(b in text for b in blobs)
    for line in lines_of((FIXTURES / CODEX_ROLLOUT).read_bytes()):
        payload = json.loads(line)["payload"]
        if payload.get("encrypted_content"):
            blobs.append(payload["encrypted_content"][:40])
    text = "\n".join(r.text for r in parse("codex", (FIXTURES / CODEX_ROLLOUT).read_bytes())[2].values())
    assert blobs and not any(b in text for b in blobs)


@needs_fixtures
@pytest.mark.parametrize("rel", ["schemas/agent-schemas__claude-code_README.md",
                                 "schemas/agent-schemas__claude-code_history.schema.json"])
def test_non_transcripts_are_not_detected(rel):
    """A README or a JSON schema next to the transcripts is no known format."""
    path = FIXTURES / rel
    assert detect_format(path, open_bytes(path, HEAD_BYTES)) is None


# ---------------------------------------------------------------- hand-made fixtures

@pytest.mark.parametrize("name,fmt", OWN)
def test_own_fixture_restart_at_every_line(name, fmt):
    """Cutting the file at ANY line, with a state round trip into a new parser, gives the
    same ops as one pass (grouping, dedup, cwd and rewind state all survive)."""
    lines = lines_of((DATA / name).read_bytes())
    one_pass = feed_with_restarts(fmt, lines, set())
    for cut in range(1, len(lines)):
        assert feed_with_restarts(fmt, lines, {cut}) == one_pass, f"restart before line {cut + 1}"
    assert feed_with_restarts(fmt, lines, set(range(len(lines)))) == one_pass


@pytest.mark.parametrize("name,fmt", OWN)
def test_own_fixture_detected_and_blobs_dropped(name, fmt, tmp_path):
    """Content detection (also renamed), and no image, signature, encrypted reasoning,
    originalFile or thought summary in any record."""
    data = (DATA / name).read_bytes()
    assert detect_format(DATA / name, data) == fmt
    (tmp_path / "renamed.log").write_bytes(data)
    assert detect_format(tmp_path / "renamed.log", data) == fmt
    _, ops, records = parse(fmt, data)
    for op in ops:
        assert not any(b in getattr(op, "text", "") for b in BLOBS)


def test_claude_groups_a_response_split_over_lines():
    """claude_edge.jsonl: msg_A's text blocks on lines 4 and 6 form ONE record (Put, then
    Append joined with a newline); its Edit is a separate tool_input record with the new
    text and the file's language; the repeated line 4 is a counted duplicate."""
    parser, ops, records = parse("claude_code", (DATA / "claude_edge.jsonl").read_bytes())
    assert [type(op).__name__ + ":" + op.key for op in ops] == [
        "Put:msg_A", "Put:msg_A/toolu_1", "Append:msg_A", "Put:msg_B/toolu_2",
        "Put:msg_B/toolu_3", "Put:msg_C/toolu_4"]
    assert records["msg_A"] == Put("msg_A", "I'll fix the bug in `add`.\nDone: `add` now adds.",
                                   ASSISTANT, "/proj/a")
    assert records["msg_A/toolu_1"] == Put("msg_A/toolu_1", "def add(a, b):\n    return a + b\n",
                                           TOOL_INPUT, "/proj/a", "python")
    assert records["msg_B/toolu_2"].text == "const x = 1;\nconst y = 2;"  # MultiEdit, each edit
    assert records["msg_B/toolu_2"].language_id == "typescript"
    assert json.loads(records["msg_B/toolu_3"].text)["command"] == "npm test -- --grep 'größe'"
    assert "größe" in records["msg_B/toolu_3"].text  # ensure_ascii=False
    assert records["msg_C/toolu_4"].language_id == "markdown"
    assert {r.cwd for k, r in records.items() if k.startswith(("msg_B", "msg_C"))} == {"/proj/b"}
    assert "msg_S" not in records  # <synthetic> client notice, not model output
    assert parser.stats.as_dict() == {"lines": 15, "records": 6, "skipped_malformed": 1,
                                      "skipped_too_deep": 0,
                                      "skipped_unknown": 1, "skipped_duplicate": 1, "dropped_blobs": 2,
                                      "decoded_with_replacement": 0}


def test_claude_duplicate_text_emits_nothing():
    """The same block text for the same message id, fed again, is counted and emits no op."""
    line = (DATA / "claude_edge.jsonl").read_bytes().split(b"\n")[3]
    parser = parser_for("claude_code")
    assert len(parser.feed_line(line)) == 1
    assert parser.feed_line(line) == [] and parser.stats.skipped_duplicate == 1


def test_codex_commands_patches_and_cwd():
    """codex_edge.jsonl: argv commands rendered as text, apply_patch kept as a diff, the
    event_msg copy of the answer ignored, cwd following turn_context, reasoning dropped."""
    parser, ops, records = parse("codex", (DATA / "codex_edge.jsonl").read_bytes())
    assert [(k, r.kind, r.text, r.cwd, r.language_id) for k, r in records.items()] == [
        ("call_1", TOOL_INPUT, "ls -la src", "/work/p1", "shellscript"),
        ("call_2", TOOL_INPUT, "*** Begin Patch\n*** Update File: a.py\n@@\n-x = 1\n+x = 2\n"
                               "*** End Patch\n", "/work/p1", "diff"),
        ("line:9", ASSISTANT, "Bumped x in a.py.", "/work/p1", None),
        ("call_3", TOOL_INPUT, "rg -n 'two words'", "/work/p2", "shellscript"),
        ("call_4", TOOL_INPUT, '{"code": "console.log(1)", "title": "t"}', "/work/p2", None),
    ]
    assert parser.stats.as_dict() == {"lines": 15, "records": 5, "skipped_malformed": 1,
                                      "skipped_too_deep": 0,
                                      "skipped_unknown": 1, "skipped_duplicate": 1, "dropped_blobs": 1,
                                      "decoded_with_replacement": 0}


def test_gemini_set_updates_last_write_wins():
    """gemini_session.jsonl: a message re-written with its tool call adds the call without
    repeating the unchanged text; a re-written m2 replaces its text; thought parts,
    thought summaries and inline images are not indexed."""
    lines = lines_of((DATA / "gemini_session.jsonl").read_bytes())
    parser = parser_for("gemini_jsonl")
    before_rewind = [op for line in lines[:11] for op in parser.feed_line(line)]
    records = apply_ops(before_rewind)
    assert records["m1/c1"] == Put("m1/c1", "print('hello')\n", TOOL_INPUT, None, "python")
    assert records["m2"].text == "Updating the greeting."
    assert [k for k in records] == ["m1", "m1/c1", "m2", "m3", "m3/c2"]
    assert parser.stats.skipped_duplicate == 3 and parser.stats.dropped_blobs == 1


def test_gemini_rewind_drops_target_and_later_records():
    """$rewindTo u2 (a user message, no record of its own) becomes Rewind of the first record
    after it, m2: m2, m3 and m3's call go; records written afterwards and $set.messages
    upserts (m5) come back. gemini-cli removes the target itself too
    (chatRecordingService.rewindTo: "from (and including) the specified ID onwards")."""
    parser, ops, records = parse("gemini_jsonl", (DATA / "gemini_session.jsonl").read_bytes())
    assert Rewind("m2") in ops
    assert {k: r.text for k, r in records.items()} == {
        "m1": "Sure, writing it.", "m1/c1": "print('hello')\n",
        "m4": "Here is another answer.", "m5": "Compressed summary reply."}
    assert parser.stats.as_dict() == {"lines": 18, "records": 8, "skipped_malformed": 1,
                                      "skipped_too_deep": 0,
                                      "skipped_unknown": 2, "skipped_duplicate": 4, "dropped_blobs": 1,
                                      "decoded_with_replacement": 0}


def test_gemini_rewind_to_model_message_and_unknown_id():
    """Rewinding to a model message drops it with its tool calls; an id the parser never saw
    is ignored and counted (its records are kept)."""
    meta = {"sessionId": "s", "projectHash": "h"}
    msgs = [meta, {"id": "u1", "type": "user", "content": "hi"},
            {"id": "m1", "type": "gemini", "content": "A",
             "toolCalls": [{"id": "c", "name": "run_shell_command", "args": {"command": "ls"}}]},
            {"id": "m2", "type": "gemini", "content": "B"}]
    data = b"\n".join(json.dumps(m).encode() for m in msgs) + b"\n"
    parser, ops, records = parse("gemini_jsonl", data + b'{"$rewindTo": "m1"}\n')
    assert ops[-1] == Rewind("m1") and records == {}
    parser, ops, records = parse("gemini_jsonl", data + b'{"$rewindTo": "nope"}\n')
    assert list(records) == ["m1", "m1/c", "m2"] and parser.stats.skipped_unknown == 1


def test_aider_replies_between_user_and_tool_lines():
    """aider_edge.md: replies are the unmarked blocks; the model's own '#### Notes' heading and
    '>>>>>>> REPLACE' stay in the reply (no two trailing spaces), an old-style multi-line
    tool message (pytest output) is not a reply, trailing blank lines are stripped."""
    _, ops, records = parse("aider", (DATA / "aider_edge.md").read_bytes())
    assert {k: r.text for k, r in records.items()} == {
        "run1/reply1": 'Here is the change:\n\nhello.py\n```python\n<<<<<<< SEARCH\n=======\n'
                       'def hello():\n    print("hello")\n>>>>>>> REPLACE\n```\n\n#### Notes\n'
                       'Keep it small.',
        "run1/reply2": "The tests pass, so no further change is needed.",
        "run2/reply1": "Hello! How can I help?",
    }
    assert isinstance(ops[0], Put) and all(isinstance(op, Append) for op in ops[1:11])


def test_aider_reply_continued_in_a_later_chunk():
    """A reply whose lines arrive in two chunks (separate parsers, state round trip) appends."""
    first = parser_for("aider")
    ops = [op for line in [b"# aider chat started at x", b"", b"#### q  ", b"", b"line one", b""]
           for op in first.feed_line(line)]
    second = parser_for("aider")
    second.load_state(json.loads(json.dumps(first.state())))
    ops += second.feed_line(b"line two") + second.feed_line(b"")
    assert apply_ops(ops)["run1/reply1"].text == "line one\n\nline two"
    assert isinstance(ops[-1], Append)


def test_generic_jsonl_assistant_only():
    """generic.jsonl: only role assistant is model output; list content joins its text parts;
    tool_calls become tool_input; unknown roles and non-JSON lines are counted."""
    parser, _, records = parse("generic_jsonl", (DATA / "generic.jsonl").read_bytes())
    assert {k: (r.kind, r.text) for k, r in records.items()} == {
        "line:3": (ASSISTANT, "Hello there."),
        "line:4": (ASSISTANT, "Part one.\nPart two."),
        "line:4/t1": (TOOL_INPUT, "make test"),
    }
    assert (parser.stats.skipped_unknown, parser.stats.skipped_malformed,
            parser.stats.dropped_blobs) == (1, 1, 1)


# ---------------------------------------------------------------- whole-file formats, inline

def test_swe_agent_uses_trajectory_not_history_and_falls_back():
    """thought/action come from trajectory[] only (history[] repeats them); history[] is used
    when trajectory[] is empty; retry runs' attempts[] are prefixed."""
    step = {"thought": "Look first.", "action": "ls", "response": "Look first.\n```\nls\n```",
            "observation": "a.py", "state": json.dumps({"working_dir": "/repo"})}
    hist = [{"role": "assistant", "content": "Look first.", "thought": "Look first.", "action": "ls"}]
    doc = {"trajectory": [step], "history": hist}
    _, _, records = parse("swe_agent", json.dumps(doc).encode())
    assert [(k, r.text, r.cwd) for k, r in records.items()] == [
        ("step0/thought", "Look first.", "/repo"), ("step0/action", "ls", "/repo")]
    _, _, records = parse("swe_agent", json.dumps({"trajectory": [], "history": hist}).encode())
    assert list(records) == ["history0/thought", "history0/action"]
    _, _, records = parse("swe_agent", json.dumps({"attempts": [doc, doc]}).encode())
    assert list(records)[-1] == "attempt1/step0/action"


def test_mini_swe_agent_tool_calls():
    """Tool-calling trajectories (format 1.1): content may be None, calls are tool_input."""
    doc = {"trajectory_format": "mini-swe-agent-1.1", "info": {}, "messages": [
        {"role": "system", "content": "sys"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "function": {"name": "bash", "arguments": '{"command": "pytest -q"}'}}]},
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}]}
    assert detect_format(Path("t.json"), json.dumps(doc).encode()) == "mini_swe_agent"
    long_patch = {"info": {"exit_status": "Submitted", "submission": "+x\n" * 5000},
                  "messages": doc["messages"], "trajectory_format": "mini-swe-agent-1"}
    head = json.dumps(long_patch, indent=2).encode()[:4096]
    assert b"mini" not in head  # only save_traj's leading keys are visible
    assert detect_format(Path("t.json"), head) == "mini_swe_agent"
    _, _, records = parse("mini_swe_agent", json.dumps(doc).encode())
    assert {k: r.text for k, r in records.items()} == {"msg1/c1": "pytest -q", "msg3": "Done."}


def test_openhands_actions():
    """Agent messages, thoughts, commands and code are indexed; user events, observations
    and display strings are not; unknown actions are counted."""
    events = [
        {"id": 0, "source": "user", "action": "message", "args": {"content": "hi"}},
        {"id": 1, "source": "agent", "action": "run", "message": "Running command: ls",
         "args": {"command": "ls -la", "thought": "Let me look."}},
        {"id": 2, "source": "agent", "observation": "run", "content": "a.py", "extras": {}},
        {"id": 3, "source": "agent", "action": "run_ipython", "args": {"code": "print(1)"}},
        {"id": 4, "source": "agent", "action": "message", "args": {"content": "All set."}},
        {"id": 5, "source": "agent", "action": "teleport", "args": {}},
    ]
    parser, _, records = parse("openhands", json.dumps(events).encode())
    assert {k: (r.kind, r.text, r.language_id) for k, r in records.items()} == {
        "event1/thought": (ASSISTANT, "Let me look.", None),
        "event1": (TOOL_INPUT, "ls -la", "shellscript"),
        "event3": (TOOL_INPUT, "print(1)", "python"),
        "event4": (ASSISTANT, "All set.", None),
    }
    assert parser.stats.skipped_unknown == 1


def test_gemini_legacy_json_last_write_and_bad_entries():
    """Legacy whole-file JSON: repeated ids keep their first place with the last text;
    non-message entries and unknown types are counted."""
    doc = {"sessionId": "s", "projectHash": "h", "messages": [
        {"id": "m1", "type": "gemini", "content": "old"}, "junk",
        {"id": "i1", "type": "info", "content": "note"}, {"id": "x", "type": "alien", "content": "?"},
        {"id": "m1", "type": "gemini", "content": [{"text": "new"}]}]}
    parser, _, records = parse("gemini_json", json.dumps(doc).encode())
    assert {k: r.text for k, r in records.items()} == {"m1": "new"}
    assert (parser.stats.skipped_malformed, parser.stats.skipped_unknown,
            parser.stats.skipped_duplicate) == (1, 1, 1)


@pytest.mark.parametrize("fmt", ["gemini_json", "swe_agent", "mini_swe_agent", "openhands"])
def test_whole_parsers_reject_unparseable_files(fmt):
    """Not JSON, or not the format's shape: TranscriptError, an InputError naming the fix."""
    for data in (b"{not json", b"42", b'"text"'):
        with pytest.raises(TranscriptError) as err:
            parser_for(fmt).parse(data)
        assert isinstance(err.value, InputError) and "format" in str(err.value)


# ---------------------------------------------------------------- robustness, registry

WEIRD_LINES = [
    b"", b"   ", b"\xff\xfe\x00garbage", b"null", b"[]", b"42", b"{}", b'{"type": 5}',
    b'{"type":"assistant","message":"str"}', b'{"type":"assistant","message":{"content":5}}',
    b'{"type":"assistant","message":{"content":[5, {"type":"tool_use","input":7}]}}',
    b'{"timestamp":"t","type":"response_item","payload":5}',
    b'{"timestamp":"t","type":"response_item",'
    b'"payload":{"type":"message","role":"assistant","content":5}}',
    b'{"timestamp":"t","type":"response_item","payload":{"type":"function_call","arguments":5}}',
    b'{"id":"m","type":"gemini","content":5,"toolCalls":5}', b'{"$set":5}', b'{"$set":{"messages":5}}',
    b'{"$rewindTo":5}', b'{"role":"assistant","content":5,"tool_calls":5}',
    b'{"role":"assistant","content":[5],"tool_calls":[5, {"function":5}]}',
    b"> unterminated tool line", b"#### x  ", b"# aider chat started at now",
]


@pytest.mark.parametrize("fmt", [f for f, c in FORMATS.items() if issubclass(c, LineParser)])
def test_line_parsers_never_raise(fmt):
    """Bad lines of every shape are counted or ignored, never raised; state stays JSON."""
    parser = parser_for(fmt)
    for line in WEIRD_LINES:
        assert isinstance(parser.feed_line(line), list)
    assert parser.stats.lines == len(WEIRD_LINES)
    json.dumps(parser.state())


@pytest.mark.parametrize("fmt", [f for f, c in FORMATS.items() if issubclass(c, WholeParser)])
def test_whole_parsers_count_bad_entries(fmt):
    """Odd values inside a well-formed document are skipped, not raised."""
    docs = [{"messages": [5, {"id": "m", "type": "gemini", "content": 5, "toolCalls": 5}],
             "trajectory": [5, {"thought": 5, "action": ["x"], "state": "{bad"}], "info": 5},
            [5, {"action": "edit", "source": "agent", "args": 5, "tool_call_metadata": 5}],
            {"history": [{"source": "agent", "action": "edit", "args": {"path": 5},
                          "tool_call_metadata": {"model_response": {
                              "choices": [{"message": {"tool_calls": 5}}]}}}]}]
    for doc in docs:
        try:
            result = parser_for(fmt).parse(json.dumps(doc).encode())
        except TranscriptError:
            continue
        assert all(isinstance(p, Put) for p in result)


def test_registry_and_unknown_format():
    """Every format is registered under its name; an unknown name names the known ones."""
    assert set(FORMATS) == {"claude_code", "codex", "gemini_json", "gemini_jsonl", "aider",
                            "swe_agent", "mini_swe_agent", "openhands", "generic_jsonl"}
    assert all(parser_for(name).format == name for name in FORMATS)
    with pytest.raises(TranscriptError, match="known formats: aider"):
        parser_for("nope")


def test_detect_unknown_content_is_none():
    """Content no parser recognises is None whatever the file is called."""
    for name, head in [("session.jsonl", b""), ("rollout-x.jsonl", b"hello world\n"),
                       ("a.traj", b'{"x": 1}'), ("h.md", b"# Title\n\nSome notes.\n"),
                       ("z.jsonl.zst", zstandard.ZstdCompressor().compress(b"plain text\n"))]:
        assert detect_format(Path(name), head) is None, name


def test_detect_names_break_ties():
    """A bare {role, content} chat line is generic JSONL; a Claude header beats it."""
    chat = b'{"role": "assistant", "content": "hi"}\n'
    assert detect_format(Path("chat.jsonl"), chat) == "generic_jsonl"
    claude = b'{"type":"user","uuid":"u","sessionId":"s","message":{"role":"user","content":"hi"}}\n'
    assert detect_format(Path("chat.jsonl"), claude + chat) == "claude_code"


# -- poison records: skipped and counted, never a lost file (issue hardening, class 1) ---------

POISON = [
    '{"role": "assistant", "content": "lone \\ud800 surrogate"}',
    '{"type": "assistant", "message": {"role": "assistant", "content": [{"type": "text",'
    ' "text": "lone \\udfff too"}]}, "uuid": "s1"}',
    "{\"x\": " + "[" * 50_000 + "]" * 50_000 + "}",  # past the recursion limit
    "[" * 50_000,
]
for key in ("type", "role", "content", "message", "payload", "text", "cwd", "uuid"):
    for odd in ([], ["assistant"], {"a": 1}, 7, None, True):
        POISON.append(json.dumps({"type": "assistant", "role": "assistant", "content": "x",
                                  "message": {"role": "assistant", "content": "y"},
                                  "payload": {"type": "message", "role": "assistant"},
                                  key: odd}))


@pytest.mark.parametrize("fmt", sorted(f for f, cls in FORMATS.items()
                                       if issubclass(cls, LineParser)))
def test_every_line_parser_skips_poison_records_and_keeps_going(fmt):
    """Each line of POISON (wrong types where strings belong, lone surrogates, nesting
    thousands deep) is skipped or stored, never raised; text never holds a surrogate."""
    parser = parser_for(fmt)
    for line in POISON:
        for op in parser.feed_line(line.encode("utf-8")):
            text = getattr(op, "text", "")
            text.encode("utf-8")  # no lone surrogate left
    assert parser.stats.lines == len(POISON)


def test_poison_lines_lose_no_good_record_of_their_file(tmp_path, store):
    """`assistd index` of a generic and a Claude Code transcript with poison lines between
    good ones: every good record stored, the surrogate one with U+FFFD, the rest counted."""
    from storage.ingest import TranscriptIngester

    good = [json.dumps({"role": "assistant", "content": f"good answer {i}"}) for i in range(3)]
    lines = [good[0], POISON[0], json.dumps({"role": ["assistant"], "content": "list role"}),
             good[1], POISON[2], good[2]]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = TranscriptIngester(store, lambda s: [ord(c) % 1000 for c in s], "fp").ingest(path)
    texts = sorted(r[0] for r in store.db.execute(
        "select text from documents where source = ?", [str(path)]).fetchall())
    assert texts == sorted([f"good answer {i}" for i in range(3)] + ["lone \ufffd surrogate"])
    # The deep line is counted once (too deep, not also malformed); the surrogate line
    # as read with replacement.
    assert (report.skipped_malformed, report.skipped_too_deep) == (1, 1) and report.files == 1
    assert report.decoded_with_replacement == 1
