"""Rewrite cases (assistd.measure.rewrite_cases) from real edits.

Git cases come from this repository's own history, pinned to the HEAD seen when the
module starts (others commit meanwhile), and from tiny repositories made in tmp_path for
what the history lacks (binary and non-UTF-8 files). Transcript cases come from the
shared fixtures (../shared/fixtures/transcripts, read in place; copies extended in
tmp_path, never in the repository) and from small sessions written inline for the
Claude Code shapes the fixtures do not hold (Read output, originalFile, failed edits).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from assistd.measure.rewrite_cases import (
    RewriteCase, changed_share, edit_window, git_cases,
)
from assistd.measure.rewrite_transcripts import (
    apply_update, parse_patch, transcript_cases,
)
from tests.conftest import FIXTURES, needs_fixtures

REPO = Path(__file__).resolve().parents[2]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture(scope="module")
def head() -> str:
    return git(REPO, "rev-parse", "HEAD").strip()


@pytest.fixture(scope="module")
def repo_cases(head) -> list[RewriteCase]:
    return git_cases(REPO, limit=12, window=30, rev=head)


def sha_of(case: RewriteCase) -> str:
    return git(REPO, "rev-parse", case.name.split(":")[1]).strip()


# ---------------------------------------------------------------------------- windows

def test_edit_window_keeps_the_context_lines_around_the_changed_lines():
    """Lines 10 and 30 of 50 change: with 3 context lines the windows run from line 7 to
    line 33 on both sides; with more context than the file they are the whole texts."""
    before = "".join(f"line {i}\n" for i in range(1, 51))
    after = before.replace("line 10\n", "line ten\n").replace("line 30\n", "line 30\nextra\n")
    b, a = edit_window(before, after, 3)
    assert b == "".join(f"line {i}\n" for i in range(7, 34))
    assert a == b.replace("line 10\n", "line ten\n").replace("line 30\n", "line 30\nextra\n")
    assert edit_window(before, after, 100) == (before, after)
    assert edit_window("x\n", "x\ny", 0) == ("", "y")  # a pure append: only the new line
    # a repeated line inserted: its equal lines above are not counted again below it
    assert edit_window("x\nx\n", "x\nx\nx\n", 0) == ("", "x\n")
    with pytest.raises(ValueError):
        edit_window(before, before, 3)


def test_changed_share_counts_a_replaced_block_by_its_longer_side():
    """Two lines replaced by three in a five-line text: three changed of six lines."""
    assert changed_share("a\nb\nc\nd\ne\n", "a\nX\nY\nZ\nd\ne\n") == pytest.approx(3 / 6)


# -------------------------------------------------------------------------------- git

def test_git_case_is_the_commit_and_its_parent_cut_to_the_window(repo_cases):
    """Every case of this repository: its windows are what edit_window cuts from the file
    at commit^ and at commit (git show), each a substring of its file at the same line,
    with 30 lines of context (fewer only at a file end), and the instruction is the
    commit's subject, then the body's first paragraph when there is one."""
    assert len(repo_cases) == 12
    for case in repo_cases:
        sha = sha_of(case)
        full_before = git(REPO, "show", f"{sha}^:{case.path}")
        full_after = git(REPO, "show", f"{sha}:{case.path}")
        assert (case.before, case.after) == edit_window(full_before, full_after, 30)
        start = full_before.index(case.before)
        assert full_after.find(case.after) == start  # the same lines above on both sides
        above = full_before[:start].count("\n")
        first_change = len(os.path.commonprefix([full_before.splitlines(True),
                                                  full_after.splitlines(True)]))
        assert above == max(0, first_change - 30)
        below = len(full_before[start + len(case.before):].splitlines())  # the last line
        # may lack its newline
        # the equal lines under the last change, never lines of the equal top again
        # (lines a commit inserts among repeated ones match both ends)
        rest = [lines[first_change:][::-1] for lines in (full_before.splitlines(True),
                                                          full_after.splitlines(True))]
        last_change = len(os.path.commonprefix(rest))
        assert below == max(0, last_change - 30)
        subject = git(REPO, "show", "-s", "--format=%s", sha).strip()
        body = git(REPO, "show", "-s", "--format=%b", sha).strip()
        assert case.instruction.split("\n")[0] == subject
        assert case.instruction == (subject if not body else
                                    f"{subject}\n\n{body.split(chr(10) + chr(10))[0].strip()}")
        assert case.source == "git" and case.before != case.after
        assert len(git(REPO, "rev-list", "--parents", "-n1", sha).split()) == 2  # no merge


def test_git_cases_one_per_commit_spread_over_languages(repo_cases):
    """At most one case per commit, unique names, newest commit first, more than one
    language (the history is mostly Python and Markdown), languages as languages.py says."""
    shas = [sha_of(c) for c in repo_cases]
    assert len(set(shas)) == len(shas)
    assert len({c.name for c in repo_cases}) == len(repo_cases)
    order = git(REPO, "rev-list", "--no-merges", shas[0]).split()
    assert [order.index(s) for s in shas] == sorted(order.index(s) for s in shas)
    assert len({c.language for c in repo_cases}) >= 4
    assert {c.language for c in repo_cases} >= {"python", "markdown"}


def test_git_cases_respect_max_chars_and_whole_files(head):
    """max_chars bounds both sides of every case; with window=None a case is the whole
    file at commit^ and at commit."""
    small = git_cases(REPO, limit=8, max_chars=1500, window=10, rev=head)
    assert small and all(len(c.before) <= 1500 and len(c.after) <= 1500 for c in small)
    whole = git_cases(REPO, limit=4, max_chars=4000, window=None, rev=head)
    assert whole
    for case in whole:
        sha = sha_of(case)
        assert case.before == git(REPO, "show", f"{sha}^:{case.path}")
        assert case.after == git(REPO, "show", f"{sha}:{case.path}")
        assert len(case.before) <= 4000 and len(case.after) <= 4000


def test_git_cases_are_deterministic(head, repo_cases):
    """Two runs on the same rev give the same cases in the same order."""
    assert git_cases(REPO, limit=12, window=30, rev=head) == repo_cases


@pytest.fixture
def tiny_repo(tmp_path) -> Path:
    """Commits: add files; modify a binary, a Latin-1 and a UTF-8 file; delete one."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}

    def commit(message: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), "add", "-A"], check=True, env=env)
        subprocess.run(["git", "-C", str(tmp_path), "commit", "-qm", message], check=True, env=env)

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    lines = [f"value_{i} = {i}\n" for i in range(20)]
    (tmp_path / "blob.bin").write_bytes(b"\0\1\2" + b"x\n" * 20)
    (tmp_path / "latin.txt").write_bytes("".join(lines).encode() + "café\n".encode("latin-1"))
    (tmp_path / "gone.py").write_text("".join(lines))
    (tmp_path / "code.py").write_text("".join(lines))
    commit("add the files")
    (tmp_path / "blob.bin").write_bytes(b"\0\1\3" + b"x\n" * 20)
    commit("binary change")
    (tmp_path / "latin.txt").write_bytes("".join(lines).encode() + "caf\xe9!\n".encode("latin-1"))
    commit("latin-1 change")
    (tmp_path / "gone.py").unlink()
    (tmp_path / "new.py").write_text("x = 1\n")
    commit("delete one, add one")
    lines[7] = "value_7 = 'seven'\n"
    (tmp_path / "code.py").write_text("".join(lines))
    commit("code: seven as a word\n\nThe first paragraph\nof the body.\n\nA second one.")
    return tmp_path


def test_git_cases_skip_binary_non_utf8_added_and_deleted_files(tiny_repo):
    """Of five commits only the UTF-8 text modification is a case: the binary and the
    Latin-1 changes, the addition, the deletion and the root commit give none. Its
    instruction is the subject and the body's first paragraph."""
    cases = git_cases(tiny_repo, window=2)
    assert [(c.path, c.language, c.source) for c in cases] == [("code.py", "python", "git")]
    case = cases[0]
    assert case.before == "value_5 = 5\nvalue_6 = 6\nvalue_7 = 7\nvalue_8 = 8\nvalue_9 = 9\n"
    assert case.after == case.before.replace("value_7 = 7", "value_7 = 'seven'")
    assert case.instruction == "code: seven as a word\n\nThe first paragraph\nof the body."
    assert case.name == f"git:{git(tiny_repo, 'rev-parse', 'HEAD')[:7]}:code.py"


def test_git_cases_skip_edits_that_change_most_of_the_window(tiny_repo):
    """The one edit changes 1 line of a 5-line window (20%): kept at 40%, gone at 10%;
    with no context the window is that line alone (100%) and only max_changed=1 keeps it."""
    assert git_cases(tiny_repo, window=2, max_changed=0.4)
    assert not git_cases(tiny_repo, window=2, max_changed=0.1)
    assert not git_cases(tiny_repo, window=0)
    assert [c.before for c in git_cases(tiny_repo, window=0, max_changed=1.0)] == ["value_7 = 7\n"]


# ------------------------------------------------------------------------ transcripts

def jsonl(path: Path, *records) -> Path:
    with path.open("a", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def tool_use(uid: str, name: str, **args) -> dict:
    return {"type": "assistant", "uuid": f"a-{uid}", "message": {
        "id": f"msg-{uid}", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [{"type": "tool_use", "id": uid, "name": name, "input": args}]}}


def tool_result(uid: str, text: str, result=None, error: bool = False) -> dict:
    rec = {"type": "user", "uuid": f"u-{uid}", "message": {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": uid, "content": text, "is_error": error}]}}
    if result is not None:
        rec["toolUseResult"] = result
    return rec


def user(text: str) -> dict:
    return {"type": "user", "uuid": "u", "message": {"role": "user", "content": text}}


@needs_fixtures
def test_the_shared_fixtures_hold_no_reconstructible_edit():
    """Counted by hand: the fixtures' only Edit (daaain) has an empty old_string (it
    creates the file), their Writes create files never seen before, and no Codex rollout
    calls apply_patch. So every fixture gives zero cases, and reading them raises nothing."""
    files = sorted(FIXTURES.glob("*/*.json*")) + sorted(FIXTURES.glob("*/*.traj"))
    assert len(files) >= 10
    assert {p.name: len(transcript_cases([p], window=None, max_changed=1.0))
            for p in files} == {p.name: 0 for p in files}


@needs_fixtures
def test_claude_code_edit_after_the_sessions_own_write(tmp_path):
    """simonw's real session writes hello.py, then the user asks for a goodbye function.
    Appended: the Edit doing it, and its success. The case's before is the Write's text,
    its after that text with old_string replaced, its instruction the user's request."""
    session = tmp_path / "session.jsonl"
    shutil.copy(FIXTURES / "claude-code" / "simonw__sample_session.jsonl", session)
    old = "    return 'Hello, World!'\n"
    new = old + "\n\ndef goodbye():\n    return 'Goodbye!'\n"
    jsonl(session, tool_use("toolu_9", "Edit", file_path="/project/hello.py",
                            old_string=old, new_string=new),
          tool_result("toolu_9", "The file /project/hello.py has been updated."))
    [case] = transcript_cases([session], window=None, max_changed=1.0)
    before = "def hello():\n    return 'Hello, World!'\n"
    assert case == RewriteCase(
        name="claude-code:session.jsonl:1", path="/project/hello.py", language="python",
        before=before, after=before.replace(old, new),
        instruction="Now add a goodbye function", source="claude-code")


@needs_fixtures
def test_codex_patch_of_a_file_the_rollout_read_whole(tmp_path):
    """The real Codex rollout reads AnalyticsPage.tsx whole (sed -n '1,260p' printed 151
    lines). Appended: an apply_patch changing one of its lines, with @@ context, and its
    success. The case's before is that output exactly, its after the same with the line
    replaced; the instruction is the rollout's last user message."""
    rollout = tmp_path / "rollout.jsonl"
    src = next((FIXTURES / "codex").glob("codemie__rollout-*.jsonl"))
    shutil.copy(src, rollout)
    target = ("/Users/Sample_User/repos/codemie-ai/codemie-ui/src/pages/analytics/"
              "AnalyticsPage.tsx")
    read = next(json.loads(line)["payload"]["call_id"] for line in src.read_text().splitlines()
                if "AnalyticsPage.tsx" in line and '"function_call"' in line)
    output = next(json.loads(line)["payload"]["output"] for line in src.read_text().splitlines()
                  if f'"call_id":"{read}"' in line and "function_call_output" in line)
    before = output.split("\nOutput:\n", 1)[1]
    last_line = "export default AnalyticsPage"
    assert before.endswith(last_line + "\n") and before.count("\n") == 151
    patch = (f"*** Begin Patch\n*** Update File: {target}\n@@\n-{last_line}\n"
             f"+export {{ AnalyticsPage }}\n+{last_line}\n*** End Patch\n")
    jsonl(rollout, {"type": "response_item", "payload": {
        "type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": patch}},
        {"type": "response_item", "payload": {
            "type": "custom_tool_call_output", "call_id": "call_p",
            "output": json.dumps({"output": f"Success. Updated the following files:\nM {target}\n",
                                  "metadata": {"exit_code": 0}})}})
    [case] = transcript_cases([rollout], window=None)
    assert case.before == before
    assert case.after == before.replace(last_line + "\n",
                                        "export { AnalyticsPage }\n" + last_line + "\n")
    assert (case.path, case.language, case.source) == (target, "typescriptreact", "codex")
    assert case.instruction.startswith("use app tools to go to Analytics")
    [windowed] = transcript_cases([rollout], window=3)
    assert (windowed.before, windowed.after) == edit_window(case.before, case.after, 3)


def test_claude_code_read_output_original_file_and_failed_edits(tmp_path):
    """A session written inline in Claude Code's shapes: a whole-file Read (numbered
    output with a system reminder after it), an Edit on it, a failed Edit (is_error), an
    Edit whose old_string occurs twice (refused: is_error), a replace_all Edit, then an Edit whose
    result carries originalFile (used as before, although it differs from what the
    session saw). Last, an Edit that succeeded although its old_string is not in the text
    the session holds (the file changed outside it): no case, and the file is forgotten,
    so the next Edit of it gives none either. Each kept case's after is its before with
    the edit applied."""
    text = "a = 1\nb = 2\nb = 2\nc = 3\n"
    numbered = "".join(f"{i:6d}→{line}\n" for i, line in enumerate(text.splitlines(), 1))
    session = jsonl(
        tmp_path / "s.jsonl", user("make c four, then bump the b's"),
        tool_use("r1", "Read", file_path="/p/x.py"),
        tool_result("r1", numbered + "\n<system-reminder>Whenever you read a file"
                          "...</system-reminder>"),
        tool_use("e1", "Edit", file_path="/p/x.py", old_string="c = 3", new_string="c = 4"),
        tool_result("e1", "updated"),
        tool_use("e2", "Edit", file_path="/p/x.py", old_string="a = 1", new_string="a = 9"),
        tool_result("e2", "File has been modified since read", error=True),
        tool_use("e3", "Edit", file_path="/p/x.py", old_string="b = 2", new_string="b = 3"),
        tool_result("e3", "Found 2 matches of the string to replace", error=True),
        user("fine, all of them"),
        tool_use("e4", "Edit", file_path="/p/x.py", old_string="b = 2", new_string="b = 3",
                 replace_all=True),
        tool_result("e4", "updated"),
        tool_use("e5", "Edit", file_path="/p/y.py", old_string="q", new_string="Q"),
        tool_result("e5", "updated", result={"filePath": "/p/y.py", "originalFile": "p\nq\nr\n"}),
        tool_use("e6", "Edit", file_path="/p/x.py", old_string="zzz", new_string="y"),
        tool_result("e6", "updated"),
        tool_use("e7", "Edit", file_path="/p/x.py", old_string="a = 1", new_string="a = 0"),
        tool_result("e7", "updated"))
    cases = transcript_cases([session], window=None, max_changed=1.0)
    assert [(c.name, c.before, c.after, c.instruction) for c in cases] == [
        ("claude-code:s.jsonl:1", text, text.replace("c = 3", "c = 4"),
         "make c four, then bump the b's"),
        ("claude-code:s.jsonl:2", text.replace("c = 3", "c = 4"),
         "a = 1\nb = 3\nb = 3\nc = 4\n", "fine, all of them"),
        ("claude-code:s.jsonl:3", "p\nq\nr\n", "p\nQ\nr\n", "fine, all of them"),
    ]


def test_malformed_transcript_lines_are_skipped(tmp_path):
    """Truncated JSON, a JSON array, invalid UTF-8, a record whose message is a string, a
    tool_use without input and a tool_result for an unknown id are skipped; the Write
    and Edit around them still give their case. A file of another format gives none."""
    session = tmp_path / "bad.jsonl"
    jsonl(session, user("rename f to g"),
          tool_use("w", "Write", file_path="/p/f.py", content="def f():\n    pass\n"),
          '{"type":"assistant","message":{"content":[{"type":"tool_use","id":"x"',
          "[1, 2, 3]", {"type": "user", "message": "not an object"},
          {"type": "assistant", "message": {"content": [{"type": "tool_use", "id": "y"}]}},
          tool_result("nobody", "orphan"),
          tool_result("w", "File created successfully"))
    with session.open("ab") as f:
        f.write(b'{"type": "user", "message": {"content": "\xff\xfe"}}\n')
    jsonl(session,
          tool_use("e", "Edit", file_path="/p/f.py", old_string="def f", new_string="def g"),
          tool_result("e", "updated"))
    [case] = transcript_cases([session], window=None, max_changed=1.0)
    assert (case.before, case.after) == ("def f():\n    pass\n", "def g():\n    pass\n")
    other = tmp_path / "notes.jsonl"
    other.write_text('{"role": "user", "content": "hi"}\nnot json\n')
    assert transcript_cases([other, session], window=None, max_changed=1.0) == [case]


def test_codex_patch_rules(tmp_path):
    """Codex apply_patch as this reader applies it: a cat output is the file; hunks match
    exactly after their @@ context line; End of File anchors at the end; a pure addition,
    a failed call and a file never read give no case; an Add File is known afterwards."""
    body = "def a():\n    return 1\n\ndef b():\n    return 1\n"
    assert apply_update(body, parse_patch(
        "*** Begin Patch\n*** Update File: m.py\n@@ def b():\n-    return 1\n+    return 2\n"
        "*** End Patch")[0][2]) == body[:-2] + "2\n"
    assert apply_update(body, parse_patch(
        "*** Begin Patch\n*** Update File: m.py\n@@\n+x = 0\n*** End Patch")[0][2]) is None
    assert parse_patch("*** Begin Patch\n*** Update File: m.py\n*** Move to: n.py\n"
                       "@@\n-a\n+b\n*** End Patch") is None

    def call(cid, name, **kw):
        return {"type": "response_item", "payload": {"type": "function_call", "call_id": cid,
                                                     "name": name, "arguments": json.dumps(kw)}}

    def out(cid, text, code=0):
        return {"type": "response_item", "payload": {
            "type": "function_call_output", "call_id": cid,
            "output": f"Chunk ID: 1\nWall time: 0 seconds\nProcess exited with code {code}\n"
                      f"Original token count: 9\nOutput:\n{text}"}}

    patch = ("*** Begin Patch\n*** Update File: src/m.py\n@@\n-    return 1\n+    return 3\n"
             "*** End of File\n*** Add File: src/n.py\n+n = 1\n*** End Patch\n")
    rollout = jsonl(
        tmp_path / "r.jsonl",
        {"type": "session_meta", "payload": {"cwd": "/w"}},
        {"type": "event_msg", "payload": {"type": "user_message", "message": "b returns 3"}},
        call("c1", "exec_command", cmd="cat src/m.py"), out("c1", body),
        call("c2", "exec_command", cmd="sed -n '1,3p' src/o.py"), out("c2", "1\n2\n3\n"),
        call("c3", "apply_patch", input=patch.replace("src/m.py", "src/o.py")), out("c3", "no", 1),
        call("c4", "apply_patch", input=patch), out("c4", "Success. Updated the following files:"),
        call("c5", "apply_patch", input="*** Begin Patch\n*** Update File: /w/src/n.py\n"
                                        "@@\n-n = 1\n+n = 2\n*** End Patch\n"),
        out("c5", "Success."))
    cases = transcript_cases([rollout], window=None, max_changed=1.0)
    assert [(c.path, c.before, c.after, c.instruction) for c in cases] == [
        ("src/m.py", body, "def a():\n    return 1\n\ndef b():\n    return 3\n", "b returns 3"),
        ("/w/src/n.py", "n = 1\n", "n = 2\n", "b returns 3")]
