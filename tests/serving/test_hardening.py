"""The daemon under hostile local clients (issue 21): slow and idle connections, the
connection cap and the descriptor limit, malformed requests on every endpoint, foreign
Host and Origin headers, log floods and secrets in the log, the watcher's restarts.

One real daemon (real model, real sockets, loopback TCP with a token) with short
timeouts set through its ``ASSISTD_*`` environment, and a descriptor limit of
:data:`NOFILE` so the connection cap is the one it derives from that limit.
"""

from __future__ import annotations

import json
import logging
import re
import resource
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from assistd.serving.config import Config
from assistd.serving.daemon import FD_RESERVE, FDS_PER_EDITOR, WatcherThread
from harness.daemon import start_daemon
from tests.conftest import server_tokenizes
from tests.daemon_helpers import wait_closed, wait_for

HEADER_TIMEOUT_MS = 1500
REPEAT_WINDOW_MS = 2000
NOFILE = 700  # the daemon's descriptor limit (soft and hard)
# Two transports (the Unix socket and TCP) share what the editor sessions' cap leaves.
CAP = (NOFILE - FD_RESERVE - FDS_PER_EDITOR * Config().max_editor_sessions) // 2
HALF_HEADER = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def _low_fd_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hardening")
    d = start_daemon(tmp, tcp=True, preexec_fn=_low_fd_limit, env={
        "ASSISTD_HEADER_TIMEOUT_MS": str(HEADER_TIMEOUT_MS),
        "ASSISTD_LOG_REPEAT_WINDOW_MS": str(REPEAT_WINDOW_MS),
        "ASSISTD_LOG_LEVEL": "debug"})  # the strictest for "no secret in the log"
    d.token = d.token_file.read_text().strip()
    d.stderr = tmp / "daemon.stderr"
    yield d
    assert d.stop() == 0


# A new connection per request: this daemon closes an idle one after 1.5 s, and a
# request sent on a pooled connection just as it closes would fail (the race of every
# HTTP keep-alive, made frequent by the short timeout).
ONE_SHOT = httpx.Limits(max_keepalive_connections=0)


@pytest.fixture(scope="module")
def uds(daemon):
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.socket), limits=ONE_SHOT),
                      base_url="http://assistd", timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def tcp(daemon):
    with httpx.Client(base_url=f"http://127.0.0.1:{daemon.port}", timeout=60, limits=ONE_SHOT,
                      headers={"Authorization": f"Bearer {daemon.token}"}) as c:
        yield c


def _connect(daemon, kind: str) -> socket.socket:
    if kind == "tcp":
        s = socket.create_connection(("127.0.0.1", daemon.port), timeout=30)
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(str(daemon.socket))
    return s


# -- slow and idle connections, the cap, the descriptor limit ---------------------------


def test_1000_slow_clients_do_not_starve_authenticated_requests(daemon, tcp, uds):
    """1,000 TCP and 200 Unix-socket clients stuck mid-headers do not stop authenticated
    requests being answered; every slow one is closed (at the cap or after the header timeout)
    and counted, and the log grows by under 20 kB."""
    before = daemon.status()["connections"]
    assert before["cap"] == CAP and before["header_timeout_s"] == HEADER_TIMEOUT_MS / 1000
    log_size = daemon.log.stat().st_size
    slow = []
    try:
        # More than the cap on TCP (the oldest are closed to make room) and some on the
        # Unix socket, each stuck in the middle of its headers.
        for i in range(1000):
            slow.append(_connect(daemon, "tcp"))
            slow[-1].sendall(HALF_HEADER)
        for i in range(200):
            slow.append(_connect(daemon, "unix"))
            slow[-1].sendall(HALF_HEADER)
        # No assertion on the descriptor count here: asyncio accepts in bursts before the
        # guard's closes run, so on a busy machine the daemon may touch its limit for a
        # moment (it then pauses accepting: see the out-of-descriptors test). What must
        # hold is below: answered meanwhile, every slow one closed, the cap counted.
        for _ in range(5):  # answered while the slow ones are open
            assert tcp.get("/v1/models").status_code == 200
            assert uds.get("/v1/models").status_code == 200
        r = tcp.post("/v1/completions", json={"model": "assistd", "prompt": "def main():",
                                               "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        # Every slow one is closed: at the cap, or after the header timeout.
        assert wait_closed(slow, timeout=HEADER_TIMEOUT_MS / 1000 + 60) == 0
    finally:
        for s in slow:
            s.close()
    after = daemon.status()["connections"]
    closed = (after["timed_out"] - before["timed_out"]) + (after["evicted"] - before["evicted"])
    assert closed >= 1200, after
    assert after["evicted"] - before["evicted"] >= 1000 - CAP, after
    assert after["open"]["tcp"] <= 2 and after["open"]["unix"] <= 2, after
    assert tcp.get("/healthz").status_code == 200
    # The floods of "closing a connection" and "at the cap" lines are counted, not logged.
    assert daemon.log.stat().st_size - log_size < 20_000


def test_a_request_body_that_never_ends_and_an_idle_keepalive_are_closed(daemon, tcp):
    """A request whose body never arrives and an idle kept-alive connection are both closed
    within the header timeout; the daemon still answers."""
    body = _connect(daemon, "tcp")
    body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                 + daemon.token.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"model\":")
    idle = _connect(daemon, "unix")
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: assistd\r\n\r\n")
    assert b"200 OK" in idle.recv(65536)  # then nothing more: idle on a kept-alive connection
    try:
        assert wait_closed([body, idle], timeout=HEADER_TIMEOUT_MS / 1000 + 60) == 0
    finally:
        body.close()
        idle.close()
    assert tcp.get("/healthz").status_code == 200


def test_the_cap_never_closes_a_connection_with_a_request_in_hand(daemon, uds):
    """A generation in hand survives a flood of new connections at the cap."""
    result = {}

    def generate():
        result["r"] = uds.post("/v1/completions", json={
            "model": "assistd", "prompt": "def main():", "max_tokens": 48, "temperature": 0})

    t = threading.Thread(target=generate)
    t.start()
    time.sleep(0.5)
    flood = [_connect(daemon, "unix") for _ in range(CAP + 50)]
    try:
        t.join(300)
        assert result["r"].status_code == 200, result["r"].text
    finally:
        for s in flood:
            s.close()


def test_out_of_descriptors_the_daemon_neither_dies_nor_wedges(tmp_path):
    """A real EMFILE: at a limit of 64 descriptors (20 in use at rest, a cap of 8 per
    transport) a burst of 150 connections runs the daemon out of descriptors in accept.
    asyncio pauses accepting for a second and logs it (once: rate limited); the cap
    frees descriptors; the daemon answers throughout and afterwards."""
    d = start_daemon(tmp_path, tcp=True,
                     preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
    try:
        burst = [_connect(d, "tcp") for _ in range(150)]  # the backlog (128) holds the rest
        assert wait_for(lambda: d.status()["connections"]["evicted"] >= 150 - 8)
        with d.uds(60) as c:
            assert c.get("/healthz").status_code == 200
        for s in burst:
            s.close()
        with d.uds(60) as c:
            assert c.get("/healthz").status_code == 200
            assert c.get("/v1/assistd/status").json()["connections"]["cap"] == 8
    finally:
        assert d.stop() == 0
    lines = [json.loads(x) for x in d.log.read_text().splitlines()]
    emfile = [x for x in lines if "out of system resource" in x["msg"]]
    assert 1 <= len(emfile) <= 4, len(emfile)  # one per listening socket and window


# -- every endpoint: malformed requests get a 4xx and a clear JSON error ---------------------


COMPLETION = {"model": "assistd", "prompt": "x", "max_tokens": 1}
CHAT = {"model": "assistd", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
COMPLETE = {"prompt_text": "x", "max_tokens": 1}
DEEP = b"[" * 100_000 + b"]" * 100_000
SHALLOWER = b'{"model": ' + b"[" * 100 + b"]" * 100 + b"}"  # under json's recursion limit

COMMON_BAD = [  # every POST endpoint
    ("empty", b""), ("not_json", b"{not json"), ("bad_utf8", b'{"a": "\xff\xfe"}'),
    ("deep", DEEP), ("deep_object", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
    ("deep_100", SHALLOWER), ("unbalanced", b"[" * 5000), ("list", b"[1]"),
    ("string", b'"x"'), ("null", b"null"), ("nan", b'{"max_tokens": NaN}'),
    ("inf", b'{"max_tokens": Infinity}'), ("huge_float", b'{"temperature": 1e400}'),
]


def _with(base: dict, **changes) -> bytes:
    body = {**base, **changes}
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


BAD = [
    *[("/v1/completions", name, body) for name, body in COMMON_BAD],
    *[("/v1/chat/completions", name, body) for name, body in COMMON_BAD],
    *[("/v1/assistd/complete", name, body) for name, body in COMMON_BAD],
    ("/v1/completions", "stop_number", _with(COMPLETION, stop=5)),
    ("/v1/completions", "stop_empty", _with(COMPLETION, stop="")),
    ("/v1/completions", "user_number", _with(COMPLETION, user=7)),
    ("/v1/completions", "best_of_3", _with(COMPLETION, best_of=3)),
    ("/v1/completions", "logit_bias", _with(COMPLETION, logit_bias={"50256": -100})),
    ("/v1/chat/completions", "logit_bias_list", _with(CHAT, logit_bias=[1])),
    ("/v1/completions", "stop_list_of_numbers", _with(COMPLETION, stop=[1, 2])),
    ("/v1/completions", "prompt_missing", _with(COMPLETION, prompt=...)),
    ("/v1/completions", "prompt_number", _with(COMPLETION, prompt=5)),
    ("/v1/completions", "prompt_nested_ids", _with(COMPLETION, prompt=[[1, 2]])),
    ("/v1/completions", "model_number", _with(COMPLETION, model=5)),
    ("/v1/completions", "seed_huge", _with(COMPLETION, seed=2**70)),
    ("/v1/completions", "max_tokens_huge", _with(COMPLETION, max_tokens=10**30)),
    ("/v1/completions", "temperature_list", _with(COMPLETION, temperature=[1])),
    ("/v1/completions", "assistd_unknown_key", _with(COMPLETION, assistd={"bogus": 1})),
    ("/v1/completions", "assistd_not_object", _with(COMPLETION, assistd="fast")),
    ("/v1/completions", "scope_huge", _with(COMPLETION, assistd={"scope": "a/" * 100_000})),
    ("/v1/completions", "stream_options_string", _with(COMPLETION, stream_options="x")),
    ("/v1/chat/completions", "messages_missing", _with(CHAT, messages=...)),
    ("/v1/chat/completions", "messages_empty", _with(CHAT, messages=[])),
    ("/v1/chat/completions", "messages_object", _with(CHAT, messages={"role": "user"})),
    ("/v1/chat/completions", "role_unknown", _with(CHAT, messages=[{"role": "wizard",
                                                                     "content": "x"}])),
    ("/v1/chat/completions", "content_number", _with(CHAT, messages=[{"role": "user",
                                                                       "content": 5}])),
    ("/v1/chat/completions", "content_missing", _with(CHAT, messages=[{"role": "user"}])),
    ("/v1/chat/completions", "stop_number", _with(CHAT, stop=5)),
    ("/v1/assistd/complete", "prompt_text_missing", _with(COMPLETE, prompt_text=...)),
    ("/v1/assistd/complete", "prompt_text_number", _with(COMPLETE, prompt_text=5)),
    ("/v1/assistd/complete", "unknown_key", _with(COMPLETE, bogus=1)),
    ("/v1/assistd/complete", "sampling_unknown_key", _with(COMPLETE, sampling={"temp": 1})),
    ("/v1/assistd/complete", "sampling_list", _with(COMPLETE, sampling=[1])),
    ("/v1/assistd/complete", "sampling_temperature_string",
     _with(COMPLETE, sampling={"temperature": "hot"})),
    ("/v1/assistd/complete", "sampling_seed_huge", _with(COMPLETE, sampling={"seed": 2**70})),
    ("/v1/assistd/complete", "sampling_top_p_zero", _with(COMPLETE, sampling={"top_p": 0})),
    ("/v1/assistd/complete", "stop_number", _with(COMPLETE, stop=5)),
    ("/v1/assistd/complete", "stop_too_many", _with(COMPLETE, stop=["a"] * 5)),
    ("/v1/assistd/complete", "max_tokens_string", _with(COMPLETE, max_tokens="5")),
    ("/v1/assistd/complete", "max_tokens_huge", _with(COMPLETE, max_tokens=10**30)),
    ("/v1/assistd/complete", "max_prompt_tokens_zero", _with(COMPLETE, max_prompt_tokens=0)),
    ("/v1/assistd/complete", "k_out_of_range", _with(COMPLETE, k=99)),
    ("/v1/assistd/complete", "k_word", _with(COMPLETE, k="fast")),
    ("/v1/assistd/complete", "language_path", _with(COMPLETE, language="../../etc")),
    ("/v1/assistd/complete", "repo_number", _with(COMPLETE, repo=5)),
    ("/v1/assistd/complete", "repo_huge", _with(COMPLETE, repo="a/" * 100_000)),
    # A chosen repo is a directory: "/etc/passwd" indexed /etc, a missing path indexed "/"
    # (issue 21, a break-it pass); ~nosuchuser was a 500.
    ("/v1/assistd/complete", "repo_a_file", _with(COMPLETE, repo=__file__)),
    ("/v1/assistd/complete", "repo_missing", _with(COMPLETE, repo="/nonexistent/zz")),
    ("/v1/assistd/complete", "repo_nul", _with(COMPLETE, repo="/tmp/\u0000x")),
    ("/v1/assistd/complete", "repo_tilde_user", _with(COMPLETE, repo="~nosuchuser/x")),
    ("/v1/assistd/complete", "proposer_unknown", _with(COMPLETE, proposer="magic")),
    ("/v1/assistd/complete", "guess_outside_git_string",
     _with(COMPLETE, guess_outside_git="yes")),
]
EXCEPTION_NAME = re.compile(r"\b[A-Z]\w*(Error|Exception)\b|Traceback")


def _assert_clear_4xx(r: httpx.Response) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    assert r.headers["content-type"].startswith("application/json")
    message = r.json()["error"]["message"]
    assert message and not EXCEPTION_NAME.search(message), message


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", _with(COMPLETION, prompt="\ud800 x")),
    ("/v1/chat/completions", _with(CHAT, messages=[{"role": "user", "content": "\ud800 x"}])),
    ("/v1/assistd/complete", _with(COMPLETE, prompt_text="\ud800 x")),
])
def test_a_lone_surrogate_in_a_prompt_is_text_on_every_endpoint(uds, path, body):
    """JSON's "\\ud800" is legal JSON and no UTF-8: /v1/assistd/complete answered 400 with
    Python's codec message while the others took it. Every Target tokenizes it as U+FFFD."""
    assert b"\\ud800" in body
    r = uds.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path,name,body", BAD, ids=[f"{p}:{n}" for p, n, _ in BAD])
def test_malformed_requests_get_a_clear_4xx(uds, path, name, body):
    """Each malformed body on the completion, chat and assistd-complete routes gets a JSON 4xx
    whose message names no Python exception."""
    r = uds.post(path, content=body, headers={"content-type": "application/json"})
    _assert_clear_4xx(r)


@pytest.mark.parametrize("method,path", [
    ("POST", "/v1/models"), ("DELETE", "/v1/completions"), ("GET", "/v1/completions"),
    ("GET", "/v1/nothing"), ("GET", "/v1/models/not-this-one"), ("POST", "/healthz"),
    ("PUT", "/v1/assistd/status"), ("POST", "/v1/assistd/stats"),
    ("GET", "/v1/assistd/stats?scope=" + "a/" * 5000),
    ("GET", "/v1/assistd/stats?scope=%00"),
])
def test_wrong_methods_paths_and_queries_get_a_clear_4xx(uds, method, path):
    """Wrong methods, unknown paths, a huge or NUL-holding scope query each get a JSON 4xx with
    a clear message."""
    _assert_clear_4xx(uds.request(method, path, content=b"{}"))


def test_the_good_bodies_of_the_matrix_are_answered(uds):
    """The bases the matrix breaks are themselves fine (so each 4xx is about its change)."""
    for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT),
                       ("/v1/assistd/complete", {**COMPLETE, "sampling": {"temperature": 0},
                                                 "stop": ["\n"], "k": 4})):
        r = uds.post(path, json=body)
        assert r.status_code == 200, (path, r.text)


# -- Host and Origin -------------------------------------------------------------------------


@pytest.mark.parametrize("headers,status,code", [
    ({"Host": "evil.example"}, 403, "forbidden_host"),
    ({"Host": "evil.example:8765"}, 403, "forbidden_host"),
    ({"Host": "127.0.0.1.evil.example"}, 403, "forbidden_host"),
    ({"Host": ""}, 403, "forbidden_host"),
    ({"Origin": "http://evil.example"}, 403, "forbidden_origin"),
    ({"Origin": "null"}, 403, "forbidden_origin"),
    ({"Origin": "http://localhost.evil.example:80"}, 403, "forbidden_origin"),
    ({"Host": "localhost:1234"}, 200, None),
    ({"Host": "[::1]:1234"}, 200, None),
    ({"Origin": "http://localhost:3000"}, 200, None),
    ({"Origin": "http://[::1]:8080"}, 200, None),
    ({}, 200, None),
])
def test_tcp_refuses_foreign_host_and_origin(tcp, headers, status, code):
    """Over TCP a non-loopback Host or Origin (DNS-rebinding look-alikes, null, empty Host) gets
    403 forbidden_host or forbidden_origin naming the header; localhost, 127.0.0.1 and [::1]
    pass."""
    r = tcp.get("/v1/models", headers=headers)
    assert r.status_code == status, r.text
    if code:
        assert r.json()["error"]["code"] == code
        assert ("Host" if code == "forbidden_host" else "Origin") in r.json()["error"]["message"]


def test_a_foreign_host_is_refused_before_the_token_and_the_socket_checks_origin(daemon, uds):
    """A foreign Host gets 403 before the token is checked (not 401); on the Unix socket any
    Host passes but a foreign Origin is refused."""
    r = httpx.get(f"http://127.0.0.1:{daemon.port}/v1/models",
                  headers={"Host": "rebound.example"})
    assert r.status_code == 403  # not 401: nothing about the token is told
    assert uds.get("/v1/models").status_code == 200  # the socket's Host is the client's
    r = uds.get("/v1/models", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_origin"


# -- logs: floods are counted, secrets never written -----------------------------------------


def test_a_flood_of_bad_requests_is_counted_not_logged(daemon, uds):
    """2,000 non-HTTP requests log under 20 kB: uvicorn's warning once, then a '[repeated N more
    times' line, accounting for every one."""
    size = daemon.log.stat().st_size
    flood = 2000
    for _ in range(flood):  # each makes uvicorn warn "Invalid HTTP request received."
        s = _connect(daemon, "unix")
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        s.recv(65536)
        s.close()
    time.sleep(REPEAT_WINDOW_MS / 1000 + 0.5)  # the window ends: the next one reports
    s = _connect(daemon, "unix")
    s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    s.recv(65536)
    s.close()
    assert uds.get("/healthz").status_code == 200
    with open(daemon.log, "rb") as f:
        f.seek(size)
        new = f.read()
    assert len(new) < 20_000, len(new)  # 2,000 lines of ~150 bytes otherwise
    lines = [json.loads(x) for x in new.splitlines()]
    invalid = [x["msg"] for x in lines if x["msg"].startswith("Invalid HTTP request received.")]
    repeated = [int(m.group(1)) for x in invalid
                if (m := re.search(r"\[repeated (\d+) more times", x))]
    assert repeated, invalid
    assert len(invalid) + sum(repeated) == flood + 1  # every one is accounted for


def test_no_prompt_text_or_token_reaches_the_log(daemon, uds, tcp):
    """Prompt text (in good and bad requests) and bearer tokens, right or wrong, never reach the
    daemon's log or stderr."""
    marker = "PROMPT-MARKER-7f3a9c"
    secret = "TOKEN-MARKER-51be20"
    uds.post("/v1/completions", json={"model": "assistd", "prompt": f"# {marker}\n",
                                      "max_tokens": 2})
    uds.post("/v1/completions", json={"model": "assistd", "prompt": f"# {marker}\n",
                                      "max_tokens": "two"})
    uds.post("/v1/chat/completions", json={"model": "assistd", "messages": [
        {"role": "user", "content": marker}], "tools": [{"x": marker}]})
    uds.post("/v1/assistd/complete", json={"prompt_text": marker, "max_tokens": 2,
                                           "bogus": marker})
    uds.post("/v1/completions", content=f'{{"prompt": "{marker}",'.encode())
    httpx.get(f"http://127.0.0.1:{daemon.port}/v1/models",
              headers={"Authorization": f"Bearer {secret}"})
    tcp.get("/v1/models")
    assert uds.get("/healthz").status_code == 200
    for path in (daemon.log, daemon.stderr):
        text = path.read_text(errors="replace")
        assert marker not in text and secret not in text and daemon.token not in text, path


def test_the_rate_limit_filter_agrees_across_handlers_and_stays_bounded(tmp_path):
    """RateLimitFilter passes the same records to every handler, one per template per window
    plus distinct texts up to a burst of 200, keeps at most 16 keys, and after the window
    reports how many repeats and drops it held back."""
    from assistd.ground.logs import RateLimitFilter

    now = [0.0]
    limit = RateLimitFilter(window_s=3600, max_keys=16, clock=lambda: now[0])
    files = [tmp_path / "a.log", tmp_path / "b.log"]
    logger = logging.getLogger("assistd.test.ratelimit")
    logger.propagate = False
    handlers = [logging.FileHandler(f) for f in files]
    for h in handlers:
        h.addFilter(limit)
        logger.addHandler(h)
    try:
        for i in range(1000):
            logger.warning("bad request from %s", i)  # one template, many arguments
            logger.warning("template %d" % i)  # many templates (pre-formatted text)
    finally:
        for h in handlers:
            logger.removeHandler(h)
            h.close()
    a, b = (f.read_text().splitlines() for f in files)
    assert a == b  # both handlers pass the same records
    assert a[0] == "bad request from 0" and not any(x.startswith("bad request") for x in a[1:])
    # Distinct texts each pass once, until the overall rate (a burst of 200) stops them.
    assert len(a) == 1 + 199, len(a)
    assert len(limit._seen) <= 16  # the distinct templates do not grow it without bound
    assert ("assistd.test.ratelimit", "bad request from %s", 999) in limit.pending()
    now[0] += 3600  # an hour later: the window is over, the rate refilled
    record = logging.LogRecord("assistd.test.ratelimit", logging.WARNING, __file__, 1,
                               "bad request from %s", ("x",), None)
    assert limit.filter(record)
    assert "[repeated 999 more times" in record.getMessage()
    assert "records dropped before this one: over 20 records/s" in record.getMessage()


def test_info_lines_that_differ_all_pass_and_exact_repeats_are_counted(tmp_path):
    """A -v log keeps one line per editor request (their numbers differ); the same line
    again is counted; a warning flood with many arguments stays one line."""
    from assistd.ground.logs import RateLimitFilter

    limit = RateLimitFilter(window_s=3600)
    logger = logging.getLogger("assistd.test.ratelimit.info")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = logging.FileHandler(tmp_path / "v.log")
    handler.addFilter(limit)
    logger.addHandler(handler)
    try:
        for i in range(50):
            logger.info("inlineCompletion python: target, %d ms", 100 + i)
        for _ in range(5):
            logger.info("status: ready")
        for i in range(50):
            logger.warning("bad request from %s", i)
    finally:
        logger.removeHandler(handler)
        handler.close()
    lines = (tmp_path / "v.log").read_text().splitlines()
    assert [x for x in lines if x.startswith("inlineCompletion")] == [
        f"inlineCompletion python: target, {100 + i} ms" for i in range(50)]
    assert lines.count("status: ready") == 1
    assert [x for x in lines if x.startswith("bad request")] == ["bad request from 0"]
    assert ("assistd.test.ratelimit.info", "status: ready", 4) in limit.pending()


# -- status: the CLI shows the guard and the watcher ------------------------------------------


def test_assistd_status_shows_connections_and_the_watcher(daemon):
    """`assistd status` shows the connection cap and timeouts, the editor socket's sessions, and
    the watcher watching (or off with the reason on a remote Target) with no restarts."""
    out = subprocess.run([sys.executable, "-m", "assistd", "status"], env=daemon.env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"(cap {CAP} each)" in out.stdout and "timed out" in out.stdout
    assert "editor socket: 0 sessions, 0 initializing" in out.stdout
    w = daemon.status()["watcher"]
    # a remote Target with the server's tokenizer: no history to watch (nothing drafts)
    if server_tokenizes():
        assert w["state"] == "off" and w["error"] is None
        assert "pass --model (the server model's GGUF or Hugging Face folder)" in w["off_reason"]
    else:
        assert w["state"] == "watching" and w["error"] is None
    assert w["restarts"] == 0


# -- the watcher restarts after a failure ------------------------------------------------------


def test_the_watcher_restarts_with_backoff_after_a_real_failure(tmp_path, target):
    """A real fault: the history database cannot be opened (its directory is a file).
    The watcher retries with a doubling backoff and reports it; once the path is
    usable again it runs."""
    blocker = tmp_path / "data"
    blocker.write_text("not a directory")
    config = Config(db=str(blocker / "history.db"), agent_transcripts=False)
    w = WatcherThread(config, target.tokenize, target.fingerprint, backoff_s=0.2,
                      max_backoff_s=0.8)
    w.start()
    try:
        assert wait_for(lambda: w.restarts >= 3)
        st = w.status()
        assert st["state"] in ("restarting", "starting") and st["error"], st
        assert wait_for(lambda: w.status()["retry_in_s"] is not None)
        assert w.status()["retry_in_s"] <= 0.8  # the backoff is capped
        blocker.unlink()
        blocker.mkdir()
        assert wait_for(lambda: w.state == "watching")
        st = w.status()
        assert st["restarts"] >= 3 and st["retry_in_s"] is None
        assert (blocker / "history.db").exists()
    finally:
        w.stop()
    assert w.state == "stopped"


def test_the_watcher_stops_promptly_while_waiting_to_restart(tmp_path, target):
    """A watcher whose database cannot be opened waits to restart (30 s backoff) yet stops
    within the stop timeout, its thread ended."""
    blocker = tmp_path / "data"
    blocker.write_text("x")
    w = WatcherThread(Config(db=str(blocker / "h.db"), agent_transcripts=False),
                      target.tokenize, target.fingerprint, backoff_s=30)
    w.start()
    assert wait_for(lambda: w.state == "restarting")
    w.stop(timeout=10)
    assert w.state == "stopped" and not w._thread.is_alive()
