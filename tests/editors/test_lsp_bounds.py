"""Issue 34 (hardening), class 6, the editor side: URIs and messages over a bound are
refused before they are parsed, with an LSP error, the session goes on, the other editor
of the daemon is still answered, and no log line is longer than the cap.

A break-it pass: a 1 MiB ``file:`` URI took 27 s, stalled every other editor on the
daemon for ~26 s, and wrote 1 MiB log lines. Real parts: `assistd lsp` and `assistd
serve` processes, pytest-lsp's client, the embedded model; raw bytes on stdin where a
test needs a message no client would send."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pygls.exceptions import JsonRpcInvalidParams

from editors.transport import MAX_LOG_LINE_CHARS, MAX_MESSAGE_BYTES, MAX_URI_CHARS
from harness.daemon import start_daemon
from harness.lsp import inline, inline_params, lsp_session, open_doc
from harness import lsp as lsp_harness
from tests.conftest import make_repo
from tests.lsp_helpers import answers as _answers
from tests.lsp_helpers import frame
from tests.remote_helpers import PROMPT

pytestmark = pytest.mark.timeout(600)  # a backstop against a hang, far above any run

# A line of the log: the cap, plus the date, level and logger name before the message
# (and the JSON keys around it in the daemon's log).
LINE_SLACK = 200


def _huge_uri(root: Path) -> str:
    """A ``file:`` URI of about 1 MiB: half a million path components."""
    return f"file://{root}/" + "d/" * (1 << 19) + "x.py"


def _check_log(text: str) -> None:
    longest = max((len(line) for line in text.splitlines()), default=0)
    assert longest <= MAX_LOG_LINE_CHARS + LINE_SLACK, longest
    assert "d/" * 1000 not in text  # the URI itself is never written out whole
    assert "Traceback" not in text


async def _refused(client, uri: str) -> JsonRpcInvalidParams:
    with pytest.raises(JsonRpcInvalidParams) as e:
        await client.text_document_inline_completion_async(inline_params(uri, 0, 0))
    return e.value


async def test_a_huge_uri_is_refused_in_process_and_the_session_goes_on(tmp_path):
    """A URI longer than MAX_URI_CHARS is refused with an invalid-params error naming the cap,
    the session goes on serving, and the log's lines stay capped without the URI whole or a
    traceback."""
    repo = make_repo(tmp_path / "repo", {"a.py": PROMPT})
    log = tmp_path / "lsp.log"
    huge = _huge_uri(repo)
    lsp_harness.LSP_ARGS[:] = ["--log-file", str(log), "-v"]  # debug lines capped too
    try:
        async with lsp_session(tmp_path / "h.db", root=repo) as (client, _):
            open_doc(client, Path(huge[len("file://"):]), "x = 1\n")  # dropped: a notification
            error = await _refused(client, huge)
            assert f"{MAX_URI_CHARS}" in str(error) and "URI" in str(error)
            uri = open_doc(client, repo / "b.py", PROMPT)
            assert await inline(client, uri, 1, 4)  # the session goes on
    finally:
        lsp_harness.LSP_ARGS[:] = []
    _check_log(log.read_text())


async def test_a_huge_uri_on_the_daemon_leaves_the_other_editor_answered(tmp_path):
    """On the daemon, one editor's huge URI is refused while another editor's request is
    answered at the same time; both sessions go on and the daemon's log and stderr stay capped,
    without traceback."""
    repo = make_repo(tmp_path / "repo", {"a.py": PROMPT})
    d = start_daemon(tmp_path / "d")
    try:
        env = d.env()
        async with lsp_session(d.db, root=repo, env=env) as (hostile, _), \
                lsp_session(d.db, root=repo, env=env) as (editor, _):
            huge = _huge_uri(repo)
            uri = open_doc(editor, repo / "b.py", PROMPT)
            open_doc(hostile, Path(huge[len("file://"):]), "x = 1\n")
            refused, answered = await asyncio.gather(_refused(hostile, huge),
                                                     inline(editor, uri, 1, 4))
            assert f"{MAX_URI_CHARS}" in str(refused)
            assert answered  # the other editor's request: a suggestion
            # and the hostile editor's own session goes on
            mine = open_doc(hostile, repo / "c.py", PROMPT)
            assert await inline(hostile, mine, 1, 4)
    finally:
        assert d.stop() == 0
    _check_log(d.log.read_text())
    _check_log((tmp_path / "d" / "daemon.stderr").read_text())


def test_a_message_over_the_bound_gets_an_lsp_error_and_is_skipped_unread(tmp_path):
    """The bound lowered to 4 KiB in a real `assistd lsp` process (the constant patched
    before it starts; sending 256 MiB would prove the same): an over-long message is
    answered InvalidRequest (id null: its id is in the part not parsed) as soon as its
    header is read, its body skipped, and the next message read and answered."""
    bound = 4096
    body = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "shutdown",
                       "params": {"pad": "x" * (2 * bound)}}).encode()
    stdin = b"".join([
        frame({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "capabilities": {}, "initializationOptions": {"assistd": {
                "db": str(tmp_path / "h.db")}}}}),
        b"Content-Length: %d\r\n\r\n" % len(body) + body,
        frame({"jsonrpc": "2.0", "id": 3, "method": "assistd/noSuchMethod"}),
        frame({"jsonrpc": "2.0", "method": "exit"})])
    code = ("import sys, editors.transport as s; s.MAX_MESSAGE_BYTES = %d;"
            " from assistd.cli import main; sys.argv[1:] = ['lsp', '--no-daemon'];"
            " main()" % bound)
    r = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True,
                       timeout=300, env={**os.environ, "ASSISTD_DB": str(tmp_path / "h.db")})
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr[-3000:]
    answers = _answers(r.stdout)
    over = [a for a in answers if a.get("error", {}).get("code") == -32600]
    assert len(over) == 1 and over[0]["id"] is None, answers
    assert f"{len(body)} bytes" in over[0]["error"]["message"]
    assert f"{bound}-byte limit" in over[0]["error"]["message"]
    assert [a["id"] for a in answers] == [1, None, 3]  # never 9: it was not parsed
    assert "error" in answers[2]  # the next message: read and answered (no such method)
    assert MAX_MESSAGE_BYTES > 100 << 20  # the real bound: a didOpen of a 100 MB file fits


def test_refused_uris_and_log_lines_are_bounded_by_documented_constants():
    """The bounds are the documented constants: a real path's URI always fits (PATH_MAX,
    4096 bytes, each byte percent-encoded to three characters, and the scheme)."""
    assert MAX_URI_CHARS >= 3 * 4096 + len("file://")
    assert 1000 <= MAX_LOG_LINE_CHARS <= 16384
