"""apply_edit on real files in tmp_path: the path rules, the routing, the diff, nothing written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from assistd.edits.fast_apply import (
    ModelRewrite, apply_edit, extract_code, merge_prompt, merge_warnings, prediction_text,
    read_source, restore_blank_lines, unified_diff,
)
from assistd.ground.errors import InputError
from tests.conftest import make_repo

APP = '''\
import json


def load(path):
    with open(path) as f:
        return json.load(f)


def save(path, data):
    with open(path, "w") as f:
        json.dump(data, f)
'''
EDIT = "app.py\n```python\n<<<<<<< SEARCH\n        json.dump(data, f)\n=======\n" \
       "        json.dump(data, f, indent=2)\n>>>>>>> REPLACE\n```\n"


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo", {"app.py": APP, "conf.json": '{"a": 1}\n'})


def snapshot(path):
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size, path.read_bytes()


def apply_unified(old: str, diff: str) -> str:
    """Re-apply a unified diff's hunks to ``old`` (the test's own applier, strict: each
    context and removed line must be where the hunk says)."""
    lines = [ln + "\n" for ln in old.split("\n")]
    lines[-1] = lines[-1][:-1]
    lines = lines if lines[-1] else lines[:-1]
    out, at, body = [], 0, diff.split("\n")[2:]
    i = 0
    while i < len(body) and body[i]:
        m = re.match(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", body[i])
        assert m, body[i]
        start = int(m.group(1)) - (0 if m.group(2) == "0" else 1)
        out += lines[at:start]
        at, i = start, i + 1
        while i < len(body) and body[i][:1] in (" ", "-", "+", "\\"):
            tag, text = body[i][:1], body[i][1:] + "\n"
            if i + 1 < len(body) and body[i + 1].startswith("\\ No newline"):
                text = text[:-1]
            if tag in (" ", "-"):
                assert lines[at] == text, (at, lines[at], text)
                at += 1
            if tag in (" ", "+"):
                out.append(text)
            i += 2 if text and not text.endswith("\n") else 1
    return "".join(out + lines[at:])


def test_a_search_replace_edit_gives_the_new_text_and_never_touches_the_file(repo):
    """Blocks apply without a model; the text comes back, both validations are
    Python's and ok, and the file's bytes and mtime are unchanged."""
    before = snapshot(repo / "app.py")
    r = apply_edit(repo / "app.py", EDIT, scope=repo)
    assert r.method == "search_replace" and r.changed and r.diff is None
    assert r.text == APP.replace("json.dump(data, f)", "json.dump(data, f, indent=2)")
    assert [(b.index, b.match) for b in r.blocks] == [(1, "exact")]
    assert r.before.ok and r.after.ok and not r.broke and r.usage is None
    assert snapshot(repo / "app.py") == before


def test_the_diff_applies_back_to_the_original(repo, tmp_path):
    """The unified diff (a/ b/ paths) re-applied hunk by hunk turns the original into
    the new text, and the reverse diff turns it back; with patch installed, patch -p1
    agrees (a file without a final newline included)."""
    (repo / "tail.txt").write_text("one\ntwo\nthree")
    edits = {"app.py": EDIT + "<<<<<<< SEARCH\nimport json\n=======\nimport json\nimport os\n"
                              ">>>>>>> REPLACE\n",
             "tail.txt": "<<<<<<< SEARCH\nthree\n=======\n3\n>>>>>>> REPLACE\n"}
    for rel, edit in edits.items():
        old = (repo / rel).read_text()
        r_text = apply_edit(rel, edit, scope=repo)
        r_diff = apply_edit(rel, edit, scope=repo, diff=True)
        assert r_diff.text is None and r_diff.diff.startswith(f"--- a/{rel}\n+++ b/{rel}\n")
        assert apply_unified(old, r_diff.diff) == r_text.text
        assert apply_unified(r_text.text, unified_diff(rel, r_text.text, old)) == old
        if shutil.which("patch"):
            work = tmp_path / "patched"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            (work / rel).write_text(old)
            subprocess.run(["patch", "-p1", "-s"], input=r_diff.diff, text=True, cwd=work,
                           check=True)
            assert (work / rel).read_text() == r_text.text
    assert r_text.text == "one\ntwo\n3"
    assert "\\ No newline at end of file" in r_diff.diff


def test_an_edit_that_breaks_the_file_is_flagged(repo):
    """A block that leaves a parenthesis open: applied (it matched), but before is ok and
    after is not, with the line; result.broke is True."""
    edit = "<<<<<<< SEARCH\n        return json.load(f)\n=======\n        return json.load(f\n" \
           ">>>>>>> REPLACE\n"
    r = apply_edit("app.py", edit, scope=repo)
    assert r.broke and r.before.ok and r.after.ok is False
    assert r.after.error.startswith("line 6:")
    j = apply_edit("conf.json", '<<<<<<< SEARCH\n{"a": 1}\n=======\n{"a": 1,}\n'
                                ">>>>>>> REPLACE\n", scope=repo)
    assert j.broke and j.after.language == "json"


def test_a_block_that_misses_names_itself_and_the_file(repo):
    """An error from the blocks reaches the caller as an InputError naming the block and
    the file (relative to the scope)."""
    with pytest.raises(InputError, match=r"block 1 \(line 3 of the edit\): its SEARCH text"
                                         r" matches nothing in app.py"):
        apply_edit("app.py", "app.py\n```\n<<<<<<< SEARCH\nnope\n=======\n\n>>>>>>> REPLACE\n",
                   scope=repo)


def test_blocks_for_another_file_are_refused(repo):
    """A filename line naming another file: one call edits one file."""
    with pytest.raises(InputError, match="is for other.py, but this edit applies to app.py"):
        apply_edit("app.py", EDIT.replace("app.py", "other.py"), scope=repo)


def test_routing_snippets_go_to_the_model_and_blocks_never_do(repo):
    """Routing only, with a FAKE model callable (a stand-in for the daemon or in-process
    chat; the real model path is tested through the API by the engineer who wires
    prediction): blocks never call it; a lazy snippet calls it once with the merge
    prompt (the snippet out of its fence and filename line) and the fenced original as
    the prediction; its fenced answer is taken out of
    the fence, its usage passed through; without a model a snippet is a clear error."""
    calls = []

    def fake_model(job):
        calls.append(job)
        merged = job.original.replace("json.dump(data, f)", "json.dump(data, f, indent=2)")
        return ModelRewrite(f"```python\n{merged}```\n", {"completion_tokens": 60,
                                                         "accepted_prediction_tokens": 55})

    apply_edit("app.py", EDIT, scope=repo, model=fake_model)
    assert calls == []
    snippet = "# ... existing code ...\ndef save(path, data):\n    with open(path, \"w\") as f:" \
              "\n        json.dump(data, f, indent=2)\n"
    r = apply_edit("app.py", f"app.py\n```python\n{snippet}```", scope=repo, model=fake_model,
                   instruction="indent the saved JSON", diff=True)
    assert len(calls) == 1
    job = calls[0]
    assert (job.path, job.language, job.snippet, job.instruction) == (
        "app.py", "python", snippet, "indent the saved JSON")
    assert job.prediction == f"```python\n{APP}```"
    assert job.messages == merge_prompt("app.py", "python", APP, snippet,
                                        "indent the saved JSON")
    assert r.method == "model" and r.lazy_markers == [(1, "# ... existing code ...")]
    assert r.usage == {"completion_tokens": 60, "accepted_prediction_tokens": 55}
    assert "+        json.dump(data, f, indent=2)" in r.diff and r.after.ok and r.warnings == []
    with pytest.raises(InputError, match="merging it needs the model"):
        apply_edit("app.py", snippet, scope=repo)


def test_merge_prompt_asks_for_the_whole_file_in_one_fence():
    """System then user; the user message holds the file and the snippet in fences longer
    than any fence inside them, the instruction, and the request for the whole file."""
    msgs = merge_prompt("README.md", "markdown", "# T\n```sh\nls\n```\n",
                        "# ... existing code ...\n", "add a line")
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "complete updated file" in msgs[0]["content"]
    user = msgs[1]["content"]
    assert "````markdown\n# T\n```sh\nls\n```\n````" in user
    assert "Instruction: add a line" in user
    assert user.endswith("Write the complete updated README.md in one ```` fence.")
    assert prediction_text("markdown", "# T\n```sh\nls\n```\n").startswith("````markdown\n")


def test_extract_code_takes_the_first_fence_and_refuses_a_cut_off_answer():
    """The body of the first fence (any info string, a longer closing fence accepted);
    an unfenced answer whole; a fence that never closes is an error, not half a file."""
    assert extract_code("Sure:\n````py\na\n```\nb\n````\nok") == "a\n```\nb\n"
    assert extract_code("~~~\nx\n~~~") == "x\n"
    assert extract_code("x = 1") == "x = 1\n"
    with pytest.raises(InputError, match="never closes"):
        extract_code("```python\nx = 1\n")


def test_model_output_keeps_the_files_line_endings(repo):
    """The model writes LF with a final newline; a CRLF file without a final newline gets
    its CRLF and no final newline back. (Fake model: see the routing test.)"""
    (repo / "w.py").write_bytes(b"a = 1\r\nb = 2")
    r = apply_edit("w.py", "a = 1\n# ... rest of file\n", scope=repo,
                   model=lambda job: ModelRewrite("```python\na = 1\nb = 3\n```"))
    assert r.text == "a = 1\r\nb = 3"


# -- the path rules ------------------------------------------------------------------------


def refused(path, scope, match):
    with pytest.raises(InputError, match=match):
        apply_edit(path, EDIT, scope=scope)


def test_paths_outside_the_scope_are_refused(repo, tmp_path):
    """A relative path climbing out, an absolute path elsewhere, a linked directory
    pointing out: all refused; the outside file is never read."""
    (tmp_path / "outside.py").write_text(APP)
    refused("../outside.py", repo, "outside the scope")
    refused(tmp_path / "outside.py", repo, "outside the scope")
    os.symlink(tmp_path, repo / "linkdir")
    refused("linkdir/outside.py", repo, "outside the scope")


def test_a_symbolic_link_is_refused_even_to_a_file_inside(repo, tmp_path):
    """A link to a file outside, and a link to a file inside: open_checked does not
    follow links, so both are refused as links."""
    (tmp_path / "outside.py").write_text(APP)
    os.symlink(tmp_path / "outside.py", repo / "out.py")
    os.symlink(repo / "app.py", repo / "in.py")
    refused("out.py", repo, "refused: it is a symbolic link")
    refused("in.py", repo, "refused: it is a symbolic link")


@pytest.mark.parametrize("rel", [".env", ".env.local", ".git/config", "id_rsa", "server.key",
                                 "node_modules/x/index.js", "secret/token.py"])
def test_credentials_git_and_ignored_files_are_refused(repo, rel):
    """The history's ignore rules: built-in excludes (.env*, .git/, keys, node_modules/)
    and the repository's .gitignore (secret/)."""
    (repo / ".gitignore").write_text("secret/\n")
    (repo / rel).parent.mkdir(parents=True, exist_ok=True)
    (repo / rel).write_text("A=1\n")
    refused(rel, repo, "the history's ignore rules exclude it")


def test_env_example_is_allowed(repo):
    """.env.example is re-included by the built-in rules (it holds no secrets)."""
    (repo / ".env.example").write_text("A=\n")
    r = apply_edit(".env.example", "<<<<<<< SEARCH\nA=\n=======\nA=1\n>>>>>>> REPLACE\n",
                   scope=repo)
    assert r.text == "A=1\n"


def test_a_fifo_a_directory_and_a_missing_file_are_refused_without_blocking(repo):
    """A FIFO is refused at once (never opened for a blocking read), a directory is not
    a regular file, a missing file is "not found"."""
    os.mkfifo(repo / "pipe.py")
    refused("pipe.py", repo, "not a regular file")
    (repo / "pkg").mkdir()
    refused("pkg", repo, "not a regular file")
    refused("gone.py", repo, "file not found")
    refused(".", repo, "the scope itself")


def test_binary_non_utf8_and_oversized_files_are_refused(repo):
    """A NUL byte (the indexer's binary check), Latin-1 bytes, and a file over the size
    cap each get their own message."""
    (repo / "b.py").write_bytes(b"x = 1\n\0\n")
    (repo / "l.py").write_bytes("s = 'caf\xe9'\n".encode("latin-1"))
    refused("b.py", repo, "a binary file")
    refused("l.py", repo, r"not UTF-8 text \(invalid byte at offset 8\)")
    with pytest.raises(InputError, match="larger than 100 bytes"):
        apply_edit("app.py", EDIT, scope=repo, max_bytes=100)


def test_a_scope_that_is_not_a_directory_is_refused(repo):
    """The scope must be a directory."""
    refused("app.py", repo / "app.py", "is not a directory")


def test_read_source_reports_the_path_relative_to_the_scope(repo):
    """An absolute path inside the scope comes back relative, with its language."""
    src = read_source(repo / "app.py", repo)
    assert (src.rel, src.language, src.text) == ("app.py", "python", APP)


def test_merge_warnings_catch_what_a_weak_merge_does():
    """The rule checks on a model's merge: the snippet's code missing from the result,
    an elision comment copied into it, half the file dropped, and a clean merge silent."""
    original = "".join(f"x{i} = {i}\n" for i in range(12))
    snippet = "# ... existing code ...\nx11 = 11\ny = 2\n"
    good = original + "y = 2\n"
    assert merge_warnings(original, snippet, good, "python") == []
    lost = merge_warnings(original, snippet, original.replace("x3 = 3\n", ""), "python")
    assert lost == ["1 of the snippet's 2 code lines are not in the merged file (first:"
                    " 'y = 2'): the merge looks wrong"]
    left = merge_warnings(original, snippet, "# ... existing code ...\nx11 = 11\ny = 2\n",
                          "python")
    assert any("still holds elision comments" in w for w in left)
    assert any("the merged file has 3 lines, the original 12" in w for w in left)


def test_blank_lines_a_small_model_squeezed_are_restored():
    """What the 135M model did to a real merge: PEP 8's two blank lines between
    functions became one, around a correct change. Deletions of blank lines only, and
    blank lines lost at the ends of a changed run, come back; the change stays; a merge
    that kept them is left alone."""
    original = "import json\n\n\ndef load(p):\n    return 1\n\n\ndef save(p):\n    dump(p)\n"
    squeezed = "import json\n\ndef load(p):\n    return 1\n\ndef save(p):\n    dump(p, 2)\n"
    fixed, n = restore_blank_lines(original, squeezed)
    assert fixed == original.replace("dump(p)", "dump(p, 2)") and n == 2
    assert restore_blank_lines(original, original) == (original, 0)
    assert restore_blank_lines("a\n\n\nb", "a\n\nc") == ("a\n\n\nc", 1)


def test_the_model_path_restores_blank_lines_and_says_so(repo):
    """Through apply_edit (FAKE model, see the routing test): the squeezed answer comes
    back with the file's blank lines, and a warning says how many were restored."""
    squeezed = APP.replace("\n\n\n", "\n\n").replace("json.dump(data, f)",
                                                     "json.dump(data, f, indent=2)")
    r = apply_edit("app.py", "# ... existing code ...\n        json.dump(data, f, indent=2)\n",
                   scope=repo, model=lambda job: ModelRewrite(f"```python\n{squeezed}```"))
    assert r.text == APP.replace("json.dump(data, f)", "json.dump(data, f, indent=2)")
    assert r.warnings == ["restored 2 blank line(s) the model dropped"]


def _block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


def test_a_scope_inside_git_internals_or_too_wide_is_refused(repo):
    """A newcomer's finding: with the scope set to the repository's .git folder the
    ignore rules (relative to the scope) excluded nothing, and .git/config came back
    whole, a remote's token included. A credentials or version-control folder on the
    path is refused whatever the scope, and so is a scope of / or the home folder."""
    (repo / ".git" / "config").write_text("[core]\n\turl = https://u:ghp_x@example.com/r\n")
    with pytest.raises(InputError, match=r"under \.git/"):
        apply_edit("config", _block("[core]", "[x]"), scope=repo / ".git")
    with pytest.raises(InputError, match="too wide"):
        apply_edit(str(repo / "app.py"), EDIT, scope="/")
    aws = repo / "home" / ".aws"
    aws.mkdir(parents=True)
    (aws / "config").write_text("[default]\nregion = x\n")
    with pytest.raises(InputError, match=r"under \.aws/"):
        apply_edit("config", _block("[default]", "[x]"), scope=aws)


@pytest.mark.parametrize("name", [".ENV", "prod.env", ".git-credentials", "credentials"])
def test_environment_and_credentials_files_are_refused_by_name(repo, name):
    """Any .env variant (any case, prod.env too) and credentials file names."""
    (repo / name).write_text("A=1\n")
    with pytest.raises(InputError, match="credentials or environment"):
        apply_edit(name, _block("A=1", "A=2"), scope=repo)


@pytest.mark.parametrize("text", [
    'TOKEN = "ghp_' + 'Zx8Kq2Lm9Pw4Rt6Yu1Io3As5Df7Gh0Jk8Lz2V"\nx = 1\n',
    "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ" * 3
    + "\n-----END OPENSSH PRIVATE KEY-----\nx = 1\n",
    "[default]\naws_access_key_id = AKIA" + "IOSFODNN7EXAMPLF\naws_secret_access_key = wJalrXUtnFEMI"
    "/K7MDENG/bPxRfiCYEXAMPLEKEZ\nx = 1\n",
], ids=["github token", "private key", "aws keys"])
def test_a_file_holding_a_secret_is_refused_and_the_error_quotes_none(repo, text):
    """The history's secrets filter runs on the file: a hit refuses it (the result would
    go back to an agent whole), naming the kind, quoting no secret."""
    (repo / "keys.txt").write_text(text)
    with pytest.raises(InputError, match="secret") as e:
        apply_edit("keys.txt", _block("x = 1", "x = 2"), scope=repo)
    assert "ghp_" not in str(e.value) and "wJalr" not in str(e.value)


def test_a_merge_that_drops_code_the_snippet_elides_is_warned_about():
    """A newcomer's finding: a lazy merge dropped a whole function after an
    '... existing code ...' marker with no warning (the file was not halved). Original
    lines gone beyond those the snippet may replace now warn; a right merge does not."""
    orig = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    x = a\n    y = b\n" \
           "    return x - y\n"
    snip = "def add(a, b):\n    return a + b + 0\n# ... existing code ...\n"
    bad = merge_warnings(orig, snip, "def add(a, b):\n    return a + b + 0\n", "python")
    assert any("code lines of the original are gone" in w for w in bad), bad
    assert merge_warnings(orig, snip, orig.replace("a + b\n", "a + b + 0\n"), "python") == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0
                    or not os.path.exists("/proc/kmsg"),
                    reason="/proc/kmsg is readable by root on Linux only")
def test_a_file_whose_read_would_wait_is_refused_in_words():
    """/proc/kmsg is 'regular' by stat and its read waits for the next kernel message:
    refused at the read (storage.walk, WOULD_BLOCK), said in words ("it a special file..."
    before), never a hang."""
    with pytest.raises(InputError, match=r"^kmsg: refused: it is a special file whose read"
                                         r" would wait"):
        apply_edit("/proc/kmsg", "<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n",
                   scope="/proc")
