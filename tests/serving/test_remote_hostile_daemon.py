"""`assistd serve --backend openai` in front of a hostile server (tests/targets/
test_remote_hostile.py's :class:`HostileServer`): a malformed chunk is a 502 in OpenAI's
error shape, a server that never finishes is ended by the deadline and the next
request is served, and a model id holding the key or escape sequences reaches neither
the API nor `assistd status`."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from harness.daemon import start_daemon
from tests.daemon_helpers import wait_for
from tests.targets.test_remote_hostile import (DONE, ESC, KEY, HostileServer, chunk,
                                               fragments)

pytestmark = pytest.mark.timeout(300)  # a backstop far above the 1.5 s deadline set here


@pytest.fixture
def hostile():
    s = HostileServer()
    yield s
    s.close()


def ask(c, max_tokens=8):
    return c.post("/v1/completions", json={"model": "remote", "prompt": "x",
                                           "max_tokens": max_tokens, "temperature": 0})


def test_hostile_answers_through_the_daemon(hostile, tmp_path):
    """Through the daemon a hostile server's malformed chunk is a one-line 502 in OpenAI's error
    shape; a trickling stream is cut at the deadline (504) while the next request is answered;
    the key and escape sequences in its model id reach neither the API, status nor log."""
    hostile.models = lambda a: a.json(200, {"data": [{"id": KEY + ESC}]})
    d = start_daemon(tmp_path, "--backend", "openai", "--target-url", hostile.url,
                     "--target-deadline-ms", "1500", env={"ASSISTD_TARGET_KEY": KEY})
    try:
        with d.uds(120) as c:
            # a chunk whose text is a number: 502, OpenAI's error shape, one line
            hostile.completions = lambda a: a.stream([b'data: {"choices":[{"text": 5}]}\n\n',
                                                      DONE])
            r = ask(c)
            err = r.json()["error"]
            assert r.status_code == 502 and err["type"] == "server_error", r.text
            assert set(err) == {"message", "type", "param", "code"} and "\n" not in err["message"]

            # a server that trickles forever holds the Target only until the deadline:
            # the request queued behind it is answered
            first = threading.Event()

            def answer(a):
                if not first.is_set():
                    first.set()
                    a.forever(chunk(""), every_s=0.2)
                else:
                    a.stream([chunk("Hello"), chunk("", "stop"), DONE])

            hostile.completions = answer
            out = {}
            th = threading.Thread(target=lambda: out.setdefault("r", ask(c)))
            th.start()
            assert first.wait(60)
            with d.uds(120) as c2:
                second = ask(c2)
            th.join(120)
            assert out["r"].status_code == 504 and "deadline" in out["r"].json()["error"]["message"]
            assert second.status_code == 200 and second.json()["choices"][0]["text"] == "Hello"

            # the model id that holds the key and escape sequences
            models = c.get("/v1/models").text
            assert not fragments(models) and "\x1b" not in models and "\\u001b" not in models
        assert wait_for(lambda: d.status()["target"]["remote"]["reachable"] is not None)
        p = subprocess.run([sys.executable, "-m", "assistd", "status"], env=d.env(),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and not fragments(p.stdout) and "\x1b" not in p.stdout
        assert not fragments(d.log.read_text())
    finally:
        assert d.stop() == 0
