"""The LSP server's parts without a client: settings, user-acceptance store, the prompt
window (KV reuse while typing), buffers in the live history, TCP transport, CLI flags."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from assistd.cli import cli
from assistd.targets.base import common_prefix_length
from editors import prompting
from assistd.runtime.runtime import Runtime, open_store
from editors.completer import Completer, Request
from editors.settings import Settings, parse_settings
from storage.retention import forget
from harness.ports import free_port
from storage.suggestions import Served, SuggestionStore
from tests.conftest import make_repo
from tests.lsp_helpers import rpc

# -- settings ------------------------------------------------------------------


def test_settings_parse_camel_case_and_fall_back_per_key():
    """Editor settings are read in camelCase (nested under assistd or not); each invalid key
    falls back to its base value with a warning naming it; a non-object gives defaults with a
    warning; maxTokens that does not fit nCtx is lowered to 64."""
    s, w = parse_settings({"assistd": {"maxTokens": 16, "k": "7", "proposer": "ngram",
                                       "fim": "off", "db": "~/h.db", "enabled": False}})
    assert (s.max_tokens, s.k, s.proposer, s.fim, s.enabled) == (16, 7, "ngram", "off", False)
    assert s.db.endswith("/h.db") and "~" not in s.db and w == []
    s2, w2 = parse_settings({"k": -1, "nCtx": 10**9, "telemetry": "yes", "model": ""}, s)
    assert (s2.k, s2.target.n_ctx, s2.telemetry, s2.target.model) == ("auto", 4096, True, None)
    assert s2.max_tokens == 16  # kept from the base
    assert len(w2) == 4 and all("invalid" in x for x in w2)
    assert parse_settings([1, 2])[1] == ["assistd settings must be an object, not list; using defaults"]
    assert parse_settings(None) == (Settings(), [])
    s3, w3 = parse_settings({"maxTokens": 600, "nCtx": 512})
    assert (s3.max_tokens, s3.target.n_ctx) == (64, 4096) and "does not fit" in w3[0]


def test_the_numerics_setting_reaches_an_own_target_and_is_said_unused_on_the_daemon(caplog):
    """``numerics`` (fast, exact or llama) goes to this server's own llama.cpp Target and
    reopens it when changed; a bad value warns naming the setting and keeps the default;
    on the daemon (a shared Runtime) the Target is the daemon's, which a warning says."""
    import logging
    from types import SimpleNamespace

    from editors.settings import environment_settings

    from assistd.targets.spec import TargetSpec

    s, w = parse_settings({"assistd": {"numerics": "exact"}})
    assert w == [] and s.target == TargetSpec(numerics="exact")
    assert Settings().target.numerics == "fast" and s.engine_key() != Settings().engine_key()
    s, w = parse_settings({"assistd": {"numerics": "bogus"}})
    assert s.target.numerics == "fast" and w == [
        "assistd setting 'numerics'='bogus' is invalid: numerics must be 'fast', 'exact' or"
        " 'llama', not 'bogus'; using 'fast'"]
    s, w = environment_settings({"ASSISTD_NUMERICS": "llama"})
    assert s.target.numerics == "llama" and w == []
    shared = Completer(shared=SimpleNamespace(target=SimpleNamespace(numerics="exact")))
    with caplog.at_level(logging.WARNING, logger="assistd.lsp"):
        shared.configure(Settings(target=TargetSpec(numerics="llama")))
    assert "numerics" in caplog.text and "its Target runs exact numerics" in caplog.text


# -- user acceptance -------------------------------------------------------------


def _served(sid="s1", text="return a + b", scope="/r"):
    return Served(id=sid, scope=scope, path="m.py", language_id="python", proposer="suffix",
                  target="llama:x", text=text)


def test_suggestion_outcomes_only_move_forward(store, target):
    """A suggestion's outcome only moves forward (shown, partial, accepted; a dismiss after a
    partial acceptance is ignored); the accepted text is one generated document, updated; the
    summary counts per language; the ledger is untouched; forget removes both."""
    ss = SuggestionStore(store)
    s = _served()
    assert ss.event(s, "shown") is None
    doc = ss.event(s, "partial", accepted_chars=6, tokenize=target.tokenize,
                   fingerprint=target.fingerprint)
    assert doc is not None and store.document_text(doc) == "return"
    assert ss.event(s, "dismissed") is None  # after a partial acceptance: ignored
    doc2 = ss.event(s, "accepted", tokenize=target.tokenize, fingerprint=target.fingerprint)
    assert doc2 == doc and store.document_text(doc) == "return a + b"  # one document, updated
    ss.event(_served("s2"), "shown")
    ss.event(_served("s2"), "dismissed")
    row = store.db.execute("select outcome, accepted_chars, shown from suggestions where id='s1'").fetchone()
    assert row == ("accepted", 12, 1)
    summary = ss.summary()["python"]
    assert (summary["shown"], summary["accepted"], summary["dismissed"]) == (2, 1, 1)
    assert summary["acceptance_rate"] == 0.5
    kinds = {r[0] for r in store.db.execute("select source_kind from documents")}
    assert kinds == {"generated"}  # user acceptance never touches the ledger table
    assert store.db.execute("select count(*) from ledger").fetchone()[0] == 0
    with pytest.raises(ValueError, match="unknown suggestion event"):
        ss.event(s, "liked")
    out = forget(store, "/r")
    assert out["suggestions"] == 2 and out["documents"] == 1


def test_accepted_secret_is_redacted_in_history(store, target):
    """An accepted suggestion holding an AWS secret key is stored with the key redacted."""
    ss = SuggestionStore(store)
    secret = 'AWS_SECRET_ACCESS_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"'
    doc = ss.event(_served(text=secret), "accepted", tokenize=target.tokenize,
                   fingerprint=target.fingerprint)
    assert "wJalrXUtnFEMI" not in store.document_text(doc)


# -- the completer on the real Target ----------------------------------------------


@pytest.fixture
def completer(target, tmp_path):
    # No time budget: what a test expects must not depend on how busy the machine is.
    # The session's loaded Target in a runtime of the test's own, shared as the daemon
    # shares its runtime: closing the Completer leaves the Target open for other tests.
    rt = Runtime(target, open_store(tmp_path / "c.db"))
    c = Completer(Settings(max_prompt_tokens=96, max_tokens=8, max_latency_ms=0), shared=rt)
    c.open()
    yield c
    c.close()
    rt.store.close()


def test_prompt_window_is_sticky_so_typing_only_appends(completer, tmp_path):
    """The prompt window's start stays at a line start while typing, so each prompt extends the
    previous one; past the budget it moves forward once."""
    text = "".join(f"value_{i} = compute({i}, scale={i * 3})\n" for i in range(60))
    uri = (tmp_path / "w.py").as_uri()
    ids = []
    for typed in ["", "v", "va", "val", "valu", "value_"]:
        doc = text + typed
        ids.append(completer._prompt_ids(uri, prompting.context_at(doc, len(doc))))
    budget = 96 - 1
    assert all(len(x) <= budget + 1 for x in ids)
    start = completer._windows[uri]
    assert start > 0 and text[start - 1] == "\n"  # a line start, past the beginning
    # Typing moved nothing: each prompt extends the previous one except its last token.
    for a, b in zip(ids, ids[1:]):
        assert common_prefix_length(a, b) >= len(a) - 2
    # Growing past the budget moves the start forward by about half, once.
    more = text + "".join(f"extra_{i} = {i}\n" for i in range(40))
    completer._prompt_ids(uri, prompting.context_at(more, len(more)))
    assert completer._windows[uri] > start


def test_open_buffers_are_live_history_and_leave_on_close(completer, tmp_path):
    """Open buffers of the repository join its live history (as buffer:NAME, tokenized) and
    leave it when closed."""
    repo = make_repo(tmp_path / "r", {"a.py": "x = 1\n"})
    other = (repo / "b.py").as_uri()
    body = "def unusual_helper_name(q):\n    return q * 17 + 3\n"
    req = Request(uri=(repo / "a.py").as_uri(), text="x = 1\n", offset=6, language="python",
                  buffers={other: body})
    completer.complete(req)
    scope = str(repo.resolve())
    docs = completer.index.documents(scope)
    names = {name for name, _ in docs.values()}
    assert "buffer:b.py" in names and "buffer:a.py" in names
    assert any(list(t) == completer.target.tokenize(body) for _, t in docs.values())
    completer.drop_buffer(other)
    assert "buffer:b.py" not in {n for n, _ in completer.index.documents(scope).values()}


def test_an_accepted_suggestion_is_stored_as_its_line_redacts_it(completer, tmp_path):
    """The completer hands the lines a suggestion completes to the suggestion store, so a
    value is judged with the assignment it completes (`db4_password = "` + the suggestion),
    not alone; what is stored is the suggestion's own stretch of the redacted line."""
    from storage.suggestions import line_context, redact_in_context

    text = 'import os\n\n\ndef connect():\n    db4_password = "'
    repo = make_repo(tmp_path / "r", {"db.py": text + '"\n'})
    req = Request(uri=(repo / "db.py").as_uri(), text=text + '"\n', offset=len(text),
                  language="python")
    s = completer.complete(req)
    assert s.text.strip(), "the Target suggested nothing here"
    served = completer._pending[s.id]
    assert (served.before, served.after) == line_context(text, '"\n')
    assert served.before.endswith('db4_password = "') and served.after == '"'
    assert completer.event(s.id, "accepted")
    expected, _ = redact_in_context(served.before, served.text, served.after)
    stored = [t for (t,) in completer.store.db.execute(
        "select text from documents where source_kind = 'generated'")]
    assert stored == ([] if expected is None else [expected]), (served.text, stored)


def test_cancelled_request_stops_before_generating(completer, tmp_path):
    """A request cancelled before it starts generates nothing (source cancelled); one cancelled
    between rounds stops after its first step, counted as cancelled_during."""
    req = Request(uri=(tmp_path / "c.py").as_uri(), text="import os\n", offset=10,
                  language="python")
    req.cancel.set()
    s = completer.complete(req)
    assert s.source == "cancelled" and s.text == "" and completer.counters.generations == 0
    # Cancelled between rounds: the engine stops at the next step.
    req2 = Request(uri=req.uri, text="import os\n", offset=10, language="python")
    calls = []

    def cancel_after_first_round():  # polled by complete(), then before every step
        calls.append(1)
        return len(calls) > 2

    req2.cancel.is_set = cancel_after_first_round  # a real Event cannot be set mid-round
    s2 = completer.complete(req2)
    assert s2.source == "cancelled" and s2.stop_reason == "cancelled"
    assert s2.ledger.steps == 1 and completer.counters.cancelled_during == 1


# -- transport and CLI --------------------------------------------------------------


def test_tcp_transport_answers_initialize(tmp_path):
    """`assistd lsp --tcp` writes its token file mode 600, answers initialize with the token
    (utf-16 positions, inline completion, the two commands), and answers params that do not
    deserialize with -32602."""
    port = free_port()
    token_file = tmp_path / "token"  # created 0600 by the server; editors send its token
    proc = subprocess.Popen([sys.executable, "-m", "assistd", "lsp", "--no-daemon", "--tcp",
                             f"127.0.0.1:{port}", "--token-file", str(token_file)],
                            stderr=subprocess.PIPE)
    try:
        for _ in range(200):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=30)
                break
            except OSError:
                threading.Event().wait(0.05)
        else:
            pytest.fail("the server did not listen")
        with sock:
            assert oct(token_file.stat().st_mode & 0o777) == "0o600"
            out = rpc(sock, 1, "initialize", {
                "capabilities": {}, "initializationOptions": {
                    "token": token_file.read_text().strip(),
                    "assistd": {"db": str(tmp_path / "t.db")}}})
            caps = out["result"]["capabilities"]
            assert caps["positionEncoding"] == "utf-16" and "inlineCompletionProvider" in caps
            assert set(caps["executeCommandProvider"]["commands"]) == {"assistd.accepted", "assistd.stats"}
            assert out["result"]["serverInfo"]["name"] == "assistd"
            # Params that do not deserialize still get their one answer: InvalidParams.
            for i, position in enumerate([{"line": -1, "character": 0}, None, {"line": 1}]):
                bad = rpc(sock, 10 + i, "textDocument/inlineCompletion", {
                    "textDocument": {"uri": "file:///x.py"}, "position": position,
                    "context": {"triggerKind": 1}})
                assert bad["id"] == 10 + i and bad["error"]["code"] == -32602
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("args,message", [
    (["--tcp", "0.0.0.0:2087"], "not a loopback address"),
    (["--tcp", "localhost"], "is not HOST:PORT"),
    (["--tcp", "127.0.0.1:99999"], "is not HOST:PORT"),
    (["--tcp", "127.0.0.1:2087", "--stdio"], "exclusive"),
])
def test_lsp_cli_refuses_bad_transports(args, message):
    """`assistd lsp` refuses a non-loopback --tcp address, a value that is not HOST:PORT or a
    port over 65535, and --tcp with --stdio, with exit 2 and a message saying which."""
    r = CliRunner().invoke(cli, ["lsp", *args])
    assert r.exit_code == 2 and message in r.output


def test_fim_prompt_layout_when_the_model_declares_fim(completer, tmp_path, monkeypatch):
    """No installable model here declares FIM tokens (SmolLM2 and Gemma 3 270M have
    none), so the capability is patched on the real Target to check the layout:
    [BOS], <fim_pre> prefix <fim_suf> suffix <fim_mid> (llama.cpp's infill order)."""
    t = completer.target
    assert t.fim_tokens() is None
    doc = "def area(r):\n    return 3.14 * r * r\n"
    cut = doc.index("3.14")
    ctx = prompting.context_at(doc, cut)
    uri = (tmp_path / "f.py").as_uri()
    plain = completer._prompt_ids(uri, ctx)
    head = [t.bos_token_id] if t.add_bos else []  # SmolLM2 does not ask for a BOS
    assert plain == head + t.tokenize(doc[:cut])
    monkeypatch.setattr(t, "fim_tokens", lambda: (7, 8, 9))
    ids = completer._prompt_ids(uri, ctx)
    assert ids == [*head, 7, *t.tokenize(doc[:cut]), 8, *t.tokenize(doc[cut:]), 9]
    completer.settings = Settings(fim="off", max_prompt_tokens=96, max_tokens=8, max_latency_ms=0)
    assert completer._prompt_ids(uri, ctx) == plain


def test_time_budget_cuts_at_a_word_boundary():
    """Over its time budget, _with_budget cuts the output at the last word boundary (trailing
    space dropped; one word is kept whole); within budget it defers to the boundary rule; budget
    0 returns the rule unchanged."""
    from editors.completer import _with_budget

    def never(text):
        return None

    late = _with_budget(never, 50, start=time.perf_counter() - 1.0)  # already over budget
    assert late("return self.val") == len("return self.")
    assert late("x = compute(a, ") == len("x = compute(a,")  # trailing space dropped
    assert late("identifier") == len("identifier")  # one word: all there is
    assert late.budget_hit
    early = _with_budget(never, 60_000, start=time.perf_counter())
    assert early("return self.val") is None and not early.budget_hit
    assert _with_budget(never, 0, start=0.0) is never  # 0 = no budget
    boundary = _with_budget(lambda t: 3 if len(t) > 3 else None, 50, start=0.0)
    assert boundary("abcdef") == 3  # the boundary rule wins


def test_lone_surrogates_become_replacement_characters():
    """A lone surrogate in editor text becomes U+FFFD; valid text is returned as the same
    object."""
    from editors.session import _valid

    assert _valid("x = '\ud800'\n") == "x = '\ufffd'\n"
    text = "ok 😋"
    assert _valid(text) is text  # nothing to do: not even a copy
