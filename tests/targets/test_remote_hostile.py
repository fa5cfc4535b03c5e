"""The remote Target against a hostile server: one that never finishes, ignores
``max_tokens``, sends endless lines and bodies, echoes the key back, answers chunks of
the wrong shape and writes terminal escape sequences.

:class:`HostileServer` is a real HTTP server on loopback (the standard library's
``http.server``) whose answers each test writes byte by byte. Each test that could hang
sets a small deadline (``deadline_s``) and asserts the error's kind; the pytest timeout
above it is only a backstop (no test asserts a duration)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assistd.ground.errors import InputError
from assistd.ground.options import DEFAULT_N_CTX
from assistd.targets.remote import (MAX_BODY_BYTES, MAX_LINE_BYTES, MAX_TOKEN_CHARS,
                                    RemoteTarget, RemoteTargetError, base_url, printable)
from tests.fuzz.strategies import JSON

pytestmark = pytest.mark.timeout(120)  # a backstop far above every deadline set here

KEY = "sk-Zq9XvW2mKp7TrL4nB8cY1dF6hJ3"  # 30 characters
MIB = 1 << 20
ESC = "\x1b]0;owned\x07\x1b[2J\x1b[31m"  # a title change, a screen clear, red


def fragments(text: str, secret: str = KEY, n: int = 6) -> list[str]:
    """The ``n``-character pieces of ``secret`` found in ``text``."""
    return [secret[i:i + n] for i in range(len(secret) - n + 1) if secret[i:i + n] in text]


def chunk(text, finish=None) -> bytes:
    body = {"choices": [{"text": text, "index": 0, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n".encode()


DONE = b"data: [DONE]\n\n"


class HostileServer:
    """An OpenAI-compatible server on loopback whose answers the test sets:
    ``completions`` and ``models`` are functions of :class:`Answer` (the default ones
    stream "Hello" and list one model). It has no tokenize endpoint (404), so the
    remote Target counts characters and sends text prompts. ``hits`` counts completion
    requests; ``sent`` is what the last answer wrote before it ended or the client hung
    up (bytes); ``gone`` is set when an answer's client hung up."""

    def __init__(self):
        self.completions = lambda a: a.stream([chunk("Hello"), chunk("", "stop"), DONE])
        self.models = lambda a: a.json(200, {"object": "list", "data": [{"id": "m"}]})
        self.hits, self.sent = 0, 0
        self.gone = threading.Event()
        self.stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # no keep-alive: a body ends when the socket closes

            def log_message(self, *args):
                pass

            def do_GET(self):
                self._answer(server.models if self.path == "/v1/models" else None)

            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                self.body = self.rfile.read(n)
                if self.path == "/v1/completions":
                    server.hits += 1
                    self._answer(server.completions)
                else:
                    self._answer(None)

            def _answer(self, fn):
                a = Answer(self, server)
                try:
                    if fn is None:
                        a.json(404, {"detail": "Not Found"})
                    else:
                        fn(a)
                except OSError:  # the client hung up
                    server.gone.set()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class Answer:
    """What a handler writes: a status with headers, then bytes."""

    def __init__(self, handler, server: HostileServer):
        self.h, self.server = handler, server
        server.sent = 0

    def head(self, status: int, headers: dict | None = None, content_type="text/event-stream"):
        self.h.send_response(status)
        self.h.send_header("Content-Type", content_type)
        for k, v in (headers or {}).items():
            self.h.send_header(k, v)
        self.h.end_headers()

    def write(self, data: bytes) -> None:
        self.h.wfile.write(data)
        self.h.wfile.flush()
        self.server.sent += len(data)

    def json(self, status: int, body, headers: dict | None = None) -> None:
        self.head(status, headers, "application/json")
        self.write(json.dumps(body).encode())

    def stream(self, parts, status: int = 200) -> None:
        self.head(status)
        for p in parts:
            self.write(p)

    def forever(self, data: bytes, every_s: float = 0.0, limit: int = 512 * MIB,
                status: int = 200, first: bytes = b"", content_type="text/event-stream") -> None:
        """``first``, then ``data`` again and again (every ``every_s`` s) until the
        client hangs up, the server closes, or ``limit`` bytes were written."""
        self.head(status, content_type=content_type)
        self.write(first)
        while not self.server.stop.is_set() and self.server.sent < limit:
            self.write(data)
            if every_s:
                time.sleep(every_s)


@pytest.fixture
def hostile():
    s = HostileServer()
    yield s
    s.close()


def target(server: HostileServer, **kw) -> RemoteTarget:
    kw.setdefault("timeout_s", 5.0)
    return RemoteTarget(server.url, **kw)


def complete(t: RemoteTarget, max_tokens: int = 8):
    return t.complete([ord("x")], max_tokens=max_tokens)  # character mode: ids are code points


def one_line(e: BaseException) -> str:
    text = str(e)
    assert "\n" not in text and "\r" not in text and "\x1b" not in text, text
    return text


# -- the deadline and the size limits ----------------------------------------------------


def test_a_server_that_trickles_chunks_forever_meets_the_deadline(hostile):
    """A chunk every 0.2 s never trips the read timeout; the deadline ends it."""
    hostile.completions = lambda a: a.forever(chunk(""), every_s=0.2)
    t = target(hostile, deadline_s=1.0)
    try:
        with pytest.raises(RemoteTargetError) as e:
            complete(t)
        assert e.value.kind == "deadline" and "deadline" in one_line(e.value)
        assert "--target-deadline-ms" in str(e.value)
        assert hostile.gone.wait(30)  # the client hung up: the server stops working for it
    finally:
        t.close()


def test_the_deadline_holds_while_the_server_sends_no_headers(hostile):
    """A server that sends no headers for 8 s is cut off at the 1 s deadline (error kind
    deadline)."""
    hostile.completions = lambda a: time.sleep(8)
    t = target(hostile, timeout_s=30.0, deadline_s=1.0)
    try:
        with pytest.raises(RemoteTargetError) as e:
            complete(t)
        assert e.value.kind == "deadline"
    finally:
        t.close()


def test_keepalives_without_text_end_at_the_read_timeout(hostile):
    """Comments every 0.1 s never trip the socket's read timeout; no text for
    twice ``timeout_s`` ends the stream, long before the deadline."""
    hostile.completions = lambda a: a.forever(b": ping\n\n", every_s=0.1)
    t = target(hostile, timeout_s=1.0, deadline_s=60.0)
    try:
        with pytest.raises(RemoteTargetError) as e:
            complete(t)
        assert e.value.kind == "deadline" and "no text for 2 s" in one_line(e.value)
        assert hostile.gone.wait(30)
    finally:
        t.close()


def test_the_default_deadline_is_the_documented_formula(hostile):
    """The read timeout for the first chunk, then 1 token a second at the least."""
    t = target(hostile, timeout_s=30.0)
    try:
        assert t.deadline_for(64) == pytest.approx(30.0 + 64)
        assert t.deadline_for(1) == pytest.approx(31.0)
    finally:
        t.close()
    t = target(hostile, timeout_s=30.0, deadline_s=2.5)
    try:
        assert t.deadline_for(4096) == 2.5  # configured: the same for every request
    finally:
        t.close()


def test_a_server_that_ignores_max_tokens_is_read_only_to_max_tokens(hostile):
    """A server streaming forever is read only to max_tokens (16 chunks of 'ab', stop_reason
    max_tokens) and the connection is closed."""
    hostile.completions = lambda a: a.forever(chunk("ab"))
    t = target(hostile, deadline_s=60.0)
    try:
        r = complete(t, max_tokens=16)
        assert r.stop_reason == "max_tokens" and r.text == "ab" * 16
        assert hostile.gone.wait(30)
    finally:
        t.close()


def test_one_huge_chunk_is_cut_at_max_tokens_worth_of_text(hostile):
    """One chunk of half MAX_LINE_BYTES is cut to max_tokens x MAX_TOKEN_CHARS characters."""
    hostile.completions = lambda a: a.stream([chunk("y" * (MAX_LINE_BYTES // 2)),
                                              chunk("", "length"), DONE])
    t = target(hostile, deadline_s=60.0)
    try:
        r = complete(t, max_tokens=4)
        assert r.stop_reason == "max_tokens" and r.text == "y" * (4 * MAX_TOKEN_CHARS)
    finally:
        t.close()


def test_an_endless_event_line_is_refused_at_its_cap(hostile):
    """An event line that never ends is refused near its cap (kind too_large, under 64 MiB read
    of 256 MiB sent) and the connection closed."""
    hostile.completions = lambda a: a.forever(b"x" * MIB, first=b"data: ", limit=256 * MIB)
    t = target(hostile, deadline_s=60.0)
    try:
        with pytest.raises(RemoteTargetError) as e:
            complete(t)
        assert e.value.kind == "too_large" and "line" in one_line(e.value)
        assert hostile.gone.wait(30)
        assert hostile.sent < 64 * MIB  # it hung up near the cap, not after 256 MiB
    finally:
        t.close()


def test_a_huge_error_body_is_read_only_to_its_cap(hostile):
    """A 300 MiB HTTP 500 body is read only to its cap; the error is one line under 500
    characters naming HTTP 500."""
    hostile.completions = lambda a: a.forever(b"e" * MIB, status=500, limit=300 * MIB,
                                              content_type="text/plain")
    t = target(hostile, deadline_s=60.0)
    try:
        with pytest.raises(RemoteTargetError) as e:
            complete(t)
        assert e.value.kind == "http" and "HTTP 500" in one_line(e.value)
        assert len(str(e.value)) < 500
        assert hostile.gone.wait(30) and hostile.sent < 64 * MIB
    finally:
        t.close()


def test_a_huge_models_list_is_refused_at_its_cap(hostile):
    """A models list past MAX_BODY_BYTES is refused at the probe: the last error names the cap
    in MiB, the server still counts as reachable, under 64 MiB read."""
    hostile.models = lambda a: a.forever(b'{"id": "m"},' * 100_000, first=b'{"data": [',
                                         limit=300 * MIB, content_type="application/json")
    t = target(hostile)  # the probe runs in the constructor
    try:
        err = t.state["last_error"]
        assert err and f"{MAX_BODY_BYTES // MIB} MiB" in err and t.state["reachable"] is True
        assert hostile.gone.wait(30) and hostile.sent < 64 * MIB
    finally:
        t.close()


def test_a_retry_after_past_the_deadline_is_not_waited_for(hostile):
    """A 503 with Retry-After 8 s past a 1 s deadline is not waited for: one request, a deadline
    or http error."""
    hostile.completions = lambda a: a.json(503, {"error": "busy"}, {"Retry-After": "8"})
    t = target(hostile, deadline_s=1.0)
    try:
        with pytest.raises(RemoteTargetError) as e:
            complete(t)
        assert e.value.kind in ("deadline", "http") and hostile.hits == 1
    finally:
        t.close()


# -- malformed answers: one line each, never a traceback -----------------------------------


def test_a_chunk_whose_text_is_a_number_is_a_one_line_error(hostile):
    """A stream chunk whose text is a number is a one-line malformed error naming text."""
    hostile.completions = lambda a: a.stream([b'data: {"choices":[{"text": 5}]}\n\n', DONE])
    t = target(hostile, deadline_s=10.0)
    try:
        with pytest.raises(RemoteTargetError) as e:
            complete(t)
        assert e.value.kind == "malformed" and "text" in one_line(e.value)
    finally:
        t.close()


def test_a_models_list_of_the_wrong_shape_is_said_not_raised(hostile):
    """A models list of the wrong shape, or ids and n_ctx of the wrong types, is recorded as
    last_error without raising: no model name, n_ctx stays the default (DEFAULT_N_CTX)."""
    hostile.models = lambda a: a.json(200, {"data": 5})
    t = target(hostile)
    try:
        assert t.state["last_error"] and t.model_name is None
        hostile.models = lambda a: a.json(200, {"data": [{"id": 7, "meta": {"n_ctx": True}}]})
        t.probe()
        assert t.model_name is None and t.n_ctx == DEFAULT_N_CTX  # not an id; not a context size
    finally:
        t.close()


CHOICE = st.fixed_dictionaries({}, optional={"text": JSON, "finish_reason": JSON, "index": JSON})
CHUNKS = st.one_of(
    JSON,
    st.fixed_dictionaries({"choices": st.one_of(JSON, st.lists(st.one_of(CHOICE, JSON),
                                                                 max_size=2))},
                          optional={"usage": JSON}))


def test_any_chunk_is_a_result_or_a_one_line_error(hostile):
    """Hypothesis writes the chunk; the answer is a completion or a RemoteTargetError
    of a known kind, one line, never another exception."""
    t = target(hostile, deadline_s=10.0)

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(CHUNKS, st.booleans())
    def check(value, finish):
        line = b"data: " + json.dumps(value).encode() + b"\n\n"
        tail = [chunk("", "stop")] if finish else []
        hostile.completions = lambda a: a.stream([line, *tail, DONE])
        try:
            r = complete(t)
        except RemoteTargetError as e:
            assert e.kind in ("malformed", "too_large"), e.kind
            one_line(e)
        else:
            assert isinstance(r.text, str) and r.stop_reason in ("eos", "max_tokens", "stop")
            assert isinstance(r.ledger.committed_tokens, int)
            assert not isinstance(r.ledger.committed_tokens, bool)

    try:
        check()
    finally:
        t.close()


def test_a_100_kb_url_is_a_one_line_input_error():
    """A 100 kB URL (long path or long host) is refused with a short InputError."""
    with pytest.raises(InputError) as e:
        base_url("http://127.0.0.1:8080/" + "a" * 100_000)
    assert len(str(e.value)) < 400
    with pytest.raises(InputError):
        RemoteTarget("http://" + "a" * 100_000 + ":8080")


# -- the key never leaves through the server's echoes --------------------------------------


@pytest.fixture
def keyed(hostile, monkeypatch):
    monkeypatch.setenv("ASSISTD_TARGET_KEY", KEY)
    return hostile


def keyed_target(server, **kw):
    from assistd.targets.remote import read_key

    return target(server, key=read_key(None), **kw)


def test_a_key_on_the_cut_of_a_long_error_is_replaced_whole(keyed, caplog):
    """The API key in a long server error, where the message is cut, is replaced whole by [the
    key]: no 6-character piece of it in the error, status or logs."""
    keyed.completions = lambda a: a.json(500, {"error": {"message": "x" * 190 + " " + KEY}})
    t = keyed_target(keyed, deadline_s=10.0)
    try:
        with caplog.at_level(logging.DEBUG), pytest.raises(RemoteTargetError) as e:
            complete(t)
        out = str(e.value) + json.dumps(t.status()) + caplog.text
        assert not fragments(out) and "[the key]" in str(e.value)
    finally:
        t.close()


def test_a_retry_after_that_holds_the_key_is_not_printed(keyed):
    """A Retry-After header holding the API key is not printed: the HTTP 429 error and status
    carry no piece of it."""
    keyed.completions = lambda a: a.json(429, {"error": "slow"}, {"Retry-After": KEY})
    t = keyed_target(keyed, deadline_s=10.0)
    try:
        with pytest.raises(RemoteTargetError) as e:
            complete(t)
        assert "HTTP 429" in str(e.value) and not fragments(str(e.value) + str(t.status()))
    finally:
        t.close()


def test_a_model_id_that_is_the_key_is_shown_without_it(keyed, caplog):
    """A model id equal to (or containing) the API key is shown as [the key] in status, warnings
    and repr; no piece of the key appears."""
    keyed.models = lambda a: a.json(200, {"data": [{"id": KEY}, {"id": "x" + KEY}]})
    with caplog.at_level(logging.DEBUG):
        t = keyed_target(keyed, model_name="other")  # the warning lists the server's ids
        t2 = keyed_target(keyed)
    try:
        assert "lists" in caplog.text
        shown = json.dumps(t.status()) + json.dumps(t2.status()) + caplog.text + repr(t2)
        assert not fragments(shown) and t2.display_model == "[the key]"
    finally:
        t.close()
        t2.close()


PLACES = ["json", "plain", "retry-after", "model"]


def test_any_echo_of_the_key_or_a_piece_of_it_is_replaced(keyed, caplog):
    """Hypothesis places the key, or a piece of it of at least 8 characters, after any
    amount of padding, in an error body (JSON or plain), a Retry-After or a model id."""
    t = keyed_target(keyed, deadline_s=10.0)

    @settings(max_examples=40, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(PLACES), st.integers(0, 400), st.integers(0, 22), st.integers(8, 30))
    def check(place, pad, start, length):
        echo = "p" * pad + KEY[start:start + length]
        if place == "json":
            keyed.completions = lambda a: a.json(502, {"error": {"message": echo}})
        elif place == "plain":
            keyed.completions = lambda a: a.stream([echo.encode()], status=502)
        elif place == "retry-after":
            keyed.completions = lambda a: a.json(429, {}, {"Retry-After": echo})
        else:
            keyed.models = lambda a: a.json(200, {"data": [{"id": echo}]})
            t.model_name = None
            t.probe()
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            try:
                complete(t)
                shown = ""
            except RemoteTargetError as e:
                shown = one_line(e)
        shown += json.dumps(t.status()) + caplog.text + json.dumps(t.display_model)
        assert not fragments(shown, n=8), (place, shown[-300:])

    try:
        check()
    finally:
        t.close()


# -- terminal control from the server is escaped ------------------------------------------


def test_escape_sequences_in_a_model_id_and_an_error_are_escaped(hostile, caplog):
    """Terminal escape sequences and lone surrogates in a model id or an error message are shown
    escaped (as \\x1b), never raw; printable() escapes control and bidi characters."""
    hostile.models = lambda a: a.json(200, {"data": [{"id": "m" + ESC}]})
    hostile.completions = lambda a: a.json(500, {"error": {"message": "bad" + ESC + "\ud800"}})
    with caplog.at_level(logging.DEBUG):
        t = target(hostile, deadline_s=10.0)
    try:
        with pytest.raises(RemoteTargetError) as e:
            complete(t)
        shown = one_line(e.value) + t.display_model + "".join(map(str, t.status().values()))
        assert "\x1b" not in shown and "\x07" not in shown and "\\x1b" in shown
        assert "\ud800" not in shown
        assert printable("a\x1b[2Jb\u202e\n") == "a\\x1b[2Jb\\u202e\\n"
    finally:
        t.close()


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "assistd", *args], capture_output=True,
                          text=True, timeout=120, env=env, errors="surrogateescape")


def test_the_cli_prints_a_hostile_error_as_one_escaped_line(hostile, tmp_path):
    """`assistd complete` against a hostile server exits 2 with one escaped error line, no raw
    ESC and no traceback, for a malformed chunk, an escape-laden error and a 100 kB URL."""
    hostile.models = lambda a: a.json(200, {"data": [{"id": "m" + ESC}]})
    hostile.completions = lambda a: a.stream([b'data: {"choices":[{"text": 5}]}\n\n', DONE])
    src = tmp_path / "a.txt"
    src.write_text("hello")
    base = ["complete", "--file", str(src), "--backend", "openai", "--db", str(tmp_path / "h.db"),
            "--no-daemon"]
    p = cli(*base, "--target-url", hostile.url, "--target-deadline-ms", "5000")
    assert p.returncode == 2 and "Traceback" not in p.stderr and "\x1b" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("error: the remote Target")
    hostile.completions = lambda a: a.json(500, {"error": {"message": ESC}})
    p = cli(*base, "--target-url", hostile.url)
    assert p.returncode == 2 and "\x1b" not in p.stderr and "\\x1b" in p.stderr
    p = cli(*base, "--target-url", "http://127.0.0.1:9/" + "a" * 100_000)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and len(p.stderr) < 1000
