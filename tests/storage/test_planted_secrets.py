"""Issue 34: the planted set, through every road into the history, and the classes a second
break-it pass found stored verbatim.

Real detect-secrets, the real model's tokenizer, real SQLite files (the ``-wal`` read while
the store is open). The planted set is issue 21's classes (``tests/storage/test_secrets.py``)
plus the ones below; every value is random (fixed seed), so no allow-list can hide one. The
roads: repository files (``index_repository``), every transcript format the ingest reads
(``storage/transcripts``), and suggestions the user accepted (``SuggestionStore``), which
are stored with the line they complete as context.
"""

from __future__ import annotations

import base64
import json
import random
import re
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.indexer import index_repository
from storage.ingest import TranscriptIngester
from storage.secrets import REDACTED, redact
from storage.store import HistoryStore
from storage.suggestions import Served, SuggestionStore, line_context
from storage.transcripts import FORMATS, HEAD_BYTES, detect_format, open_bytes
from storage.walk import iter_files
from tests.conftest import make_repo
from tests.storage.test_secrets import PLANTED, SECRETS

_R = random.Random(34)
ALNUM = string.ascii_letters + string.digits
LOWER_DIGITS = string.ascii_lowercase + string.digits
_TOK = ALNUM + "-_"


def _r(n: int, alphabet: str = ALNUM) -> str:
    return "".join(_R.choice(alphabet) for _ in range(n))


def _pw(tag: str) -> str:
    return f"Pw{tag}{_r(3, string.digits)}{_r(8)}"


def _b64(raw: str) -> str:
    return base64.b64encode(raw.encode()).decode()


_AWS_SECRET = _r(40, ALNUM + "/+")
_AWS_ID = "AKIA" + _r(16, string.ascii_uppercase + string.digits)
_SPLIT_SECRET = _r(40, ALNUM + "/+")
_NETRC_PW = _pw("n")

# class -> (file name it sits in, text, the secret substrings that must not be stored).
# A secret cut in pieces (string concatenation) lists each piece.
NEW: dict[str, tuple[str, str, list[str]]] = {}


def _add(cls: str, filename: str, template: str, *values: str) -> None:
    NEW[cls] = (filename, template.format(*values), list(values))


# 1. basic auth in a URL with an empty user name (redis, amqp, postgres all allow it)
_add("redis_empty_user", "notes.txt", "connect with redis://:{}@cache.internal:6379/0 then ping",
     _pw("a"))
_add("redis_empty_user_py", "settings.py", 'REDIS_URL = "redis://:{}@cache:6379/0"\n', _pw("b"))
_add("amqp_empty_user_env", "deploy.sh", "export BROKER=amqp://:{}@mq.internal:5672//\n",
     _pw("c"))
# 2. a token in a URL's query string, of lower entropy than the entropy plugins ask for
_add("url_access_token", "notes.md",
     "fetch https://api.example.com/v2/items?page=2&access_token={} and page on", _r(24, LOWER_DIGITS))
_add("url_private_token", "ci.sh",
     'curl "https://gitlab.example.com/api/v4/projects?private_token={}"\n', _r(20, LOWER_DIGITS))
_add("url_api_key_param", "client.py",
     'URL = "https://maps.example.com/geo?q=Paris&api_key={}&fmt=json"\n', _r(32, LOWER_DIGITS))
# 3. docker config.json "auth": base64 of user:password, short
_add("docker_auth_repo", "docker/config.json",
     '{{\n  "auths": {{\n    "registry.example.com": {{\n      "auth": "{}"\n    }}\n  }}\n}}\n',
     _b64("ci:" + _pw("d")[:9]))
_add("docker_auth_fenced", "notes.md",
     'Put this in ~/.docker/config.json:\n```json\n{{"auths": {{"ghcr.io": {{"auth": "{}"}}}}}}\n'
     "```\n", _b64("octo:" + _pw("e")[:8]))
# 4. an unquoted base64 blob of an API key
_add("base64_openai_key", "notes.txt", "stored it as {} in the vault",
     _b64("sk-proj-" + _r(60, _TOK)))
_add("base64_github_token", "values.yaml", "github_b64: {}\n", _b64("ghp_" + _r(36)))
_add("base64_user_password", "notes.txt", "creds (base64): {}\n", _b64("deploy:" + _pw("f")))
# 5. .netrc-style lines in a file that is not called .netrc
_add("netrc_line", "notes.txt", "machine api.example.com login deploy password {}\n", _NETRC_PW)
_add("netrc_block", "README.txt",
     "machine git.example.com\n  login ci-bot\n  password {}\n\nthen push\n", _pw("g"))
_add("netrc_default", "setup.txt", "default login anonymous password {}\n", _pw("h"))
# 6. an AWS secret key on the line after the one naming it, both lines comments
_add("aws_secret_hash_comments", "deploy.py",
     "import boto3\n# the secret access key is\n# {}\nclient = boto3.client('s3')\n", _AWS_SECRET)
_add("aws_secret_slash_comments", "main.go",
     "// AWS secret access key:\n// {}\nfunc main() {{}}\n", _r(40, ALNUM + "/+"))
# 7. a key split across two string literals
_add("split_aws_secret", "creds.py", 'aws_secret = "{}" + "{}"\n', _SPLIT_SECRET[:20],
     _SPLIT_SECRET[20:])
_add("split_aws_id", "creds.js", 'const id = "{}" + "{}";\n', _AWS_ID[:10], _AWS_ID[10:])
_add("split_github_token", "ci.py", 'TOKEN = ("ghp_{}"\n         "{}")\n', _r(18), _r(18))
# 8. a password in a Markdown table
_add("markdown_table", "ACCOUNTS.md",
     "| user | password | note |\n|------|----------|------|\n| admin | {} | rotate |\n"
     "| ci | {} | |\n", _pw("i"), _pw("j"))
_add("markdown_table_token", "access.md",
     "| Service | Token |\n| --- | --- |\n| grafana | `{}` |\n", _r(28, LOWER_DIGITS))

# A fourth break-it run. 9. an AWS secret access key next to its key id (prose, the IAM
# console's CSV, the next line), with no keyword naming it
_add("aws_pair_prose", "notes.md", "- AWS creds: {} / {}\n",
     "AKIA" + _r(16, string.ascii_uppercase + string.digits), _r(38, ALNUM + "/+") + "7q")
_add("aws_pair_csv", "credentials.csv", "User name,Access key ID,Secret access key\nci,{},{}\n",
     "AKIA" + _r(16, string.ascii_uppercase + string.digits), _r(38, ALNUM + "/+") + "4Z")
_add("aws_pair_next_line", "deploy.txt", "deploy user for the bucket:\n{}\n{}\nthen sync\n",
     "ASIA" + _r(16, string.ascii_uppercase + string.digits), _r(38, ALNUM + "/+") + "2b")
# 10. a key cut in two implicitly concatenated literals, the keyword inside the first
_IMPLICIT_SECRET = _r(40, ALNUM + "/+")
_add("split_keyword_implicit", "settings.py",
     'CONFIG = (\n    "aws_secret_access_key = {}"\n    "{}"\n)\n', _IMPLICIT_SECRET[:13],
     _IMPLICIT_SECRET[13:])

SPLIT = {"split_aws_secret": _SPLIT_SECRET, "split_aws_id": _AWS_ID,
         "split_keyword_implicit": _IMPLICIT_SECRET}


# -- the classes, one at a time ---------------------------------------------------------


@pytest.mark.parametrize("cls", NEW)
def test_each_new_class_is_redacted_and_the_rest_stays(cls):
    """Each class of the second break-it pass, alone in its file type and as free text: no
    value (nor a piece of a split one) is left, the text around it is, and the prefilter
    and a second pass change nothing."""
    filename, text, values = NEW[cls]
    for name in (filename, ""):
        out = redact(text, filename=name)
        assert [v for v in values if v in out.text] == [], (name, out.text)
        assert out.count >= 1
        assert redact(text, filename=name, prefilter=False) == out
        assert redact(out.text, filename=name).text == out.text
    kept = redact(text, filename=filename).text
    first_line = text.splitlines()[0]
    if not any(v in first_line for v in values):
        assert first_line in kept  # the line naming the secret stays
    for cls_joined, whole in SPLIT.items():
        if cls == cls_joined:
            assert whole not in redact(text).text


@pytest.mark.parametrize("line", [
    # URLs: no credential, or a reference
    "redis://:@localhost:6379/0\n", 'url = "redis://:%s@%s" % (password, host)\n',
    "redis://:${REDIS_PASSWORD}@cache:6379\n", "https://x.example/?access_token=<token>\n",
    "https://x.example/cb?access_token={access_token}\n", "?api_key=YOUR_API_KEY\n",
    "https://docs.example.com/search?q=token&page=2\n",
    # docker "auth" that is not base64 of user:password
    '{"auth": "none"}\n', '"auth": "oauth2"\n', '{"auth": "dGVzdA=="}\n',
    # base64 of ordinary text
    "data: SGVsbG8sIHdvcmxkISBIb3cgYXJlIHlvdSB0b2RheT8=\n",
    # netrc documentation
    "machine host.example.com login USER password PASSWORD\n",
    "    machine, login and password tokens are read from ~/.netrc\n",
    # comments after a line naming a key that are no key
    "# the secret access key is read from the environment\n# see docs/aws.md for details\n",
    # concatenated literals that are no secret
    'msg = "abc" + "def"\n', 'path = "/usr/local/" + "lib/python3.11/site-packages"\n',
    # Markdown tables naming a password column without one
    "| option | password |\n|---|---|\n| required | yes |\n| default | none |\n",
    "| Token | Meaning |\n|---|---|\n| NAME | identifier |\n| NUMBER | number |\n",
])
def test_near_misses_of_the_new_classes_are_left_alone(line):
    """Lines that look like the new secret classes but hold none (empty URL passwords, variable
    references, placeholders) come back unchanged."""
    assert redact(line).text == line, redact(line).text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pw=st.text(alphabet=ALNUM + "!%+-_~", min_size=8, max_size=32).filter(
    lambda s: any(c.isdigit() for c in s) and any(c.isalpha() for c in s)
    and s[0].isalnum() and not re.match(r"(?i)your|example|changeme", s)),
    shape=st.sampled_from(["redis://:{}@cache:6379/0", "machine h login u password {}",
                           "| admin | {} |", "amqp://:{}@mq//"]))
def test_fuzzed_passwords_in_the_new_shapes(pw, shape):
    """Any password of letters, digits and a few symbols, in each new shape (a Markdown
    table row under a password header), is gone."""
    text = shape.format(pw)
    if shape.startswith("|"):
        text = "| user | password |\n|---|---|\n" + text + "\n"
    out = redact(text).text
    assert pw not in out, out


# -- the fourth break-it run's own inputs, as it found them stored ----------------------

_TESTER = [
    ("- AWS creds: AKIAIOSFODNN7REALKEY / 9dF3kL0pQ7rT2vX5zB8nM1cW4yH6jA0sE3gU7iO9",
     "- AWS creds: [REDACTED] / [REDACTED]"),
    ("- pw=Rt5!kd93Lq", "- pw=[REDACTED]"),
    ("- ssh root@10.0.0.5 (pass: Xk29!mnBv)", "- ssh root@10.0.0.5 (pass: [REDACTED])"),
    ("- staging login: deploy / Kj8#mQ2wLz", "- staging login: deploy / [REDACTED]"),
    ("Login for staging: user deploy, pass Kj8#mQ2wLz",
     "Login for staging: user deploy, pass [REDACTED]"),
    ('redis.Redis(host="r", password=os.environ.get("X", "FallbackPw!9z"))',
     'redis.Redis(host="r", password=os.environ.get("X", "[REDACTED]"))'),
    ('    "aws_secret_access_key = PtYgjmUhBel31"\n    "q8Zr2Lk9Wm4Xv7Nc1Bt5Hy3Pd6Jf0"\n',
     '    "aws_secret_access_key = [REDACTED]"\n    "[REDACTED]"\n'),
]


@pytest.mark.parametrize("text,expected", _TESTER)
def test_the_fourth_break_it_inputs_are_redacted_exactly(text, expected):
    """The tester's lines: every secret is replaced, nothing else, with the prefilter on and
    off, in a .py, a .md and no file alike; a second pass changes nothing."""
    for name in ("", "notes.md", "x.py"):
        out = redact(text, filename=name)
        assert out.text == expected, (name, out.text)
        assert redact(text, filename=name, prefilter=False) == out
        assert redact(out.text, filename=name).text == expected


def test_the_split_key_in_the_fast_apply_tests_is_redacted_whole():
    """tests/edits/test_fast_apply.py cuts an AWS secret key in two adjacent literals on two
    lines, the keyword inside the first: neither piece may be stored."""
    path = Path(__file__).parents[1] / "edits" / "test_fast_apply.py"
    text = path.read_text("utf-8")
    assert "wJalrXUtnFEMI" in text and "/K7MDENG/bPxRfiCYEXAMPLEKEZ" in text
    for name in ("", "tests/edits/test_fast_apply.py"):
        out = redact(text, filename=name)
        assert "wJalrXUtnFEMI" not in out.text and "K7MDENG" not in out.text
        assert 'aws_secret_access_key = [REDACTED]"\n    "[REDACTED]\\nx = 1' in out.text
        assert redact(text, filename=name, prefilter=False) == out


@pytest.mark.parametrize("line", [
    # "pass" and "pw" in prose and code, with no password after them
    "pass the test\n", "pw=None\n", "pass: see below\n", "login: deploy / staging\n",
    "    pass\n", "pw = getpass()\n", "pw = self.pw\n", "pw = hash_pw(raw)\n",
    "pw: $PASSWORD\n", "pass: <password>\n", "pw=${PW}\n", "pass=1\n",
    "Please pass python3 as the interpreter.\n", "user deploy, pass it on to ops\n",
    "login: admin / <password>\n", "login: see docs/auth2fa.md\n", "bypass: Xk29mnBv2\n",
    "the user ran it, pass rate 93%\n", "compass=Nw23Deg\n",
    # environment lookups whose default is no secret, or whose name names none
    'os.environ.get("TOKEN_DTYPE", "uint32")\n', 'os.getenv("DB_PASSWORD", "")\n',
    'password=os.environ.get("DB_PASSWORD", "changeme")\n',
    'os.environ.get("HOME", "/home/user2")\n', 'timeout=os.environ.get("TIMEOUT", "30s")\n',
    'os.environ.get("CACHE_KEY", "users:v2")\n', 'token = os.getenv("GH_TOKEN", None)\n',
    'level = os.environ.get("LOG_LEVEL", "INFO2")\n',
    # an AWS key id next to a 40-character run that is no secret key
    "AKIAIOSFODNN7EXAMPLE at 0123456789abcdef0123456789abcdef01234567\n",
    "AKIAIOSFODNN7EXAMPLE ThisIsAVeryLongCamelCaseIdentifierNameXy\n",
])
def test_near_misses_of_the_fourth_run_are_left_alone(line):
    """Ordinary prose and code that holds "pass", "pw", "login", an environment lookup with a
    default, or an AWS key id next to a hash: nothing but the key id is redacted."""
    expected = line.replace("AKIAIOSFODNN7EXAMPLE", REDACTED)
    assert redact(line).text == expected, redact(line).text
    assert redact(line, prefilter=False).text == expected


# -- every road into the history -----------------------------------------------------------


def planted_texts() -> list[tuple[str, str, list[str]]]:
    """(class, text, secret substrings) of the whole planted set: issue 21's classes, the
    settings of test_secrets' SECRETS kinds, and the new ones above."""
    out = [(cls, t.format(v=v), [v]) for cls, (t, v) in PLANTED.items()]
    out += [(f"{kind}_env", f"{name}={value}\n", [value])
            for kind, (name, value, _) in SECRETS.items()]
    out += [(cls, text, values) for cls, (_, text, values) in NEW.items()]
    return out


def test_the_planted_set_is_large_and_varied():
    """The planted secret set has at least 80 distinct values and the filter names at least 15
    secret kinds in it."""
    texts = planted_texts()
    values = [v for _, _, vs in texts for v in vs]
    assert len(values) >= 80 and len(set(values)) == len(values)
    kinds = {kind for _, t, _ in texts for kind in redact(t).kinds}
    assert len(kinds) >= 15, kinds


def _jl(records) -> bytes:
    return ("\n".join(json.dumps(r) for r in records) + "\n").encode()


def _claude(texts, cwd):
    recs = []
    for i, t in enumerate(texts):
        content = ([{"type": "tool_use", "id": f"toolu_{i}", "name": "Bash",
                     "input": {"command": t}}] if i % 2 else [{"type": "text", "text": t}])
        recs.append({"type": "assistant", "cwd": cwd, "uuid": f"u{i}", "sessionId": "s34",
                     "message": {"id": f"m{i}", "role": "assistant", "content": content}})
    return "claude.jsonl", _jl(recs)


def _codex(texts, cwd):
    recs = [{"timestamp": "2026-01-01T00:00:00Z", "type": "session_meta",
             "payload": {"id": "s34", "cwd": cwd}}]
    for i, t in enumerate(texts):
        payload = ({"type": "function_call", "name": "exec_command", "call_id": f"c{i}",
                    "arguments": json.dumps({"cmd": ["bash", "-lc", t]})} if i % 2 else
                   {"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": t}]})
        recs.append({"timestamp": "2026-01-01T00:00:01Z", "type": "response_item",
                     "payload": payload})
    return "rollout.jsonl", _jl(recs)


def _gemini_messages(texts):
    return [{"id": f"m{i}", "type": "gemini", "content": t} if i % 2 else
            {"id": f"m{i}", "type": "gemini", "content": "Running it.",
             "toolCalls": [{"id": f"c{i}", "name": "run_shell_command",
                            "args": {"command": t}, "status": "success"}]}
            for i, t in enumerate(texts)]


def _gemini_json(texts, cwd):
    return "session-34.json", json.dumps({"sessionId": "g34", "projectHash": "ab",
                                          "messages": _gemini_messages(texts)}).encode()


def _gemini_jsonl(texts, cwd):
    head = {"sessionId": "g34", "projectHash": "ab", "startTime": "2026-02-01T10:00:00Z"}
    return "session-34.jsonl", _jl([head, *_gemini_messages(texts)])


def _swe_agent(texts, cwd):
    steps = [{"thought": t, "action": "echo ok", "observation": "ok",
              "state": {"working_dir": cwd}} if i % 2 else
             {"thought": "Run it.", "action": t, "observation": "",
              "state": {"working_dir": cwd}} for i, t in enumerate(texts)]
    return "run.traj", json.dumps({"trajectory": steps, "history": [], "info": {}}).encode()


def _mini_swe_agent(texts, cwd):
    msgs = [{"role": "system", "content": "You are an agent."}]
    for t in texts:
        msgs += [{"role": "user", "content": "go on"}, {"role": "assistant", "content": t}]
    return "run.traj.json", json.dumps({"trajectory_format": "mini-swe-agent-1",
                                        "info": {"mini_version": "1.0"},
                                        "messages": msgs}).encode()


def _openhands(texts, cwd):
    events = [{"id": 0, "source": "user", "action": "message", "args": {"content": "go"}}]
    for i, t in enumerate(texts, 1):
        events.append({"id": i, "source": "agent", "action": "run" if i % 2 else "message",
                       "args": {"command": t, "thought": ""} if i % 2 else {"content": t}})
    return "openhands.json", json.dumps(events).encode()


def _aider(texts, cwd):
    out = ["# aider chat started at 2026-01-01 10:00:00", "", "> /usr/bin/aider  ", ""]
    for t in texts:
        out += ["#### go on  ", "", t.rstrip("\n"), ""]
    return ".aider.chat.history.md", ("\n".join(out) + "\n").encode()


def _generic(texts, cwd):
    recs = [{"role": "system", "content": "helpful"}]
    for t in texts:
        recs += [{"role": "user", "content": "go on"}, {"role": "assistant", "content": t}]
    return "chat.jsonl", _jl(recs)


TRANSCRIPT_BUILDERS = {"claude_code": _claude, "codex": _codex, "gemini_json": _gemini_json,
                       "gemini_jsonl": _gemini_jsonl, "swe_agent": _swe_agent,
                       "mini_swe_agent": _mini_swe_agent, "openhands": _openhands,
                       "aider": _aider, "generic_jsonl": _generic}


def test_every_transcript_format_has_a_builder():
    """Every transcript format the ingester knows has a builder that plants secrets in it."""
    assert set(TRANSCRIPT_BUILDERS) == set(FORMATS)


# Not on the suggestion road: the first half of a key cut in two literals on two lines. The
# suggestion that completes the first line holds a piece that is no secret on that line; the
# second half, accepted later, is redacted (its line context holds both), the first was not.
NOT_SUGGESTED = {"split_github_token", "split_keyword_implicit"}


def _accept_all(store, scope, target) -> int:
    """Every planted text typed up to its secret, then the rest of the line accepted as a
    suggestion (whole, and partly from inside the value); returns the documents stored."""
    events = SuggestionStore(store)
    n = 0
    for i, (cls, text, values) in enumerate(planted_texts()):
        if cls in NOT_SUGGESTED:
            continue
        at = text.find(values[0])
        for j, start in enumerate((at, at + min(4, len(values[0]) // 3))):
            line_end = text.find("\n", start)
            line_end = len(text) if line_end < 0 else line_end
            before, after = line_context(text[:start], text[line_end:])
            served = Served(id=f"s{i}-{j}", scope=scope, path=f"buf{i}.py",
                            language_id="python", proposer="suffix", target="llama:x",
                            text=text[start:line_end], before=before, after=after)
            events.event(served, "shown")
            doc = events.event(served, "accepted", tokenize=target.tokenize,
                               fingerprint=target.fingerprint)
            n += doc is not None
    return n


def _no_value_in(blob: str | bytes, values) -> list[str]:
    if isinstance(blob, bytes):
        return [v for v in values if v.encode() in blob]
    return [v for v in values if v in blob]


def test_no_planted_value_is_stored_by_any_road(tmp_path, target):
    """The whole planted set in repository files, in a transcript of every format and as
    accepted suggestions: no value is in the stored text, in the decoded tokens, or in the
    bytes of the database and its -wal (read while the store is open, and after)."""
    texts = planted_texts()
    planted = [v for _, _, vs in texts for v in vs]
    values = planted + [vs[0][min(4, len(vs[0]) // 3):] for _, _, vs in texts]
    files = {"app.py": "def ok():\n    return 1\n"}
    for i, (cls, text, _) in enumerate(texts):
        name = NEW[cls][0] if cls in NEW else ("notes/%s.md" if i % 2 else "scripts/%s.sh") % cls
        files[f"{cls}/{name}"] = text
    repo = make_repo(tmp_path / "repo", files).resolve()
    scope = str(repo)
    db = tmp_path / "h.db"
    store = HistoryStore(db)
    try:
        report = index_repository(store, repo, target.tokenize, target.fingerprint)
        assert report.redactions >= len(planted) - 10
        ingester = TranscriptIngester(store, target.tokenize, target.fingerprint)
        sessions = tmp_path / "sessions"
        for fmt, build in TRANSCRIPT_BUILDERS.items():
            name, data = build([t for _, t, _ in texts], scope)
            path = sessions / fmt / name
            path.parent.mkdir(parents=True)
            path.write_bytes(data)
            assert detect_format(path, open_bytes(path, HEAD_BYTES)) == fmt
            got = ingester.ingest(path, scope)
            assert got.records_put >= len(texts), (fmt, got.as_dict())
            assert got.redactions >= len(planted) - 10, (fmt, got.as_dict())
        assert _accept_all(store, scope, target) == 2 * (len(texts) - len(NOT_SUGGESTED))
        stored = "\n".join(t for (t,) in store.db.execute("select text from documents"))
        assert _no_value_in(stored, values) == []
        decoded = "\n".join(
            target.detokenize(ids.tolist())
            for (sc,) in store.db.execute("select distinct scope from documents").fetchall()
            for _, _, ids in store.token_arrays(sc, target.fingerprint))
        assert _no_value_in(decoded, values) == []
        live = b"".join(p.read_bytes() for p in tmp_path.glob("h.db*"))
        assert (tmp_path / "h.db-wal").exists()
        assert _no_value_in(live, values) == []
        # what is around the values is kept
        assert "machine api.example.com login deploy password [REDACTED]" in stored
        assert "redis://:[REDACTED]@cache.internal:6379/0" in stored
    finally:
        store.close()
    assert _no_value_in(b"".join(p.read_bytes() for p in tmp_path.glob("h.db*")), values) == []


# -- accepted suggestions: the line they complete decides -----------------------------------

_PW_ACCEPT = _pw("k")


@pytest.mark.parametrize("before,accepted,value", [
    ('import os\ndb4_password = "', f'{_PW_ACCEPT}"', _PW_ACCEPT),
    ("#!/bin/sh\nmysql -u root -p", f"{_PW_ACCEPT} shop", _PW_ACCEPT),
    ("export AWS_SECRET_ACCESS_KEY=", _AWS_SECRET, _AWS_SECRET),
    ("# the secret access key is\n# ", _AWS_SECRET, _AWS_SECRET),
    ("machine api.example.com login deploy password ", _NETRC_PW, _NETRC_PW),
    ('token = "ghp_', _r(36) + '"', None),
], ids=["quoted_password", "mysql_p", "export_aws", "comment_aws", "netrc", "ghp_from_inside"])
def test_an_accepted_suggestion_is_redacted_with_the_line_it_completes(
        tmp_path, target, before, accepted, value):
    """The break-it cases: the buffer ends where a secret starts, the suggestion is the
    secret. Stored: the suggestion with the value replaced, nowhere in the file or -wal."""
    value = value or accepted[:-1]
    store = HistoryStore(tmp_path / "h.db")
    try:
        b, a = line_context(before, "\nprint('done')\n")
        s = Served(id="s1", scope="/r", path="m.py", language_id="python", proposer="suffix",
                   target="llama:x", text=accepted, before=b, after=a)
        doc = SuggestionStore(store).event(s, "accepted", tokenize=target.tokenize,
                                           fingerprint=target.fingerprint)
        assert doc is not None
        text = store.document_text(doc)
        assert value not in text and REDACTED in text, text
        assert not any(value[i:i + 8] in text for i in range(len(value) - 7)), text
        assert value.encode() not in b"".join(p.read_bytes() for p in tmp_path.glob("h.db*"))
    finally:
        store.close()


def test_an_accepted_suggestion_that_completes_no_secret_is_stored_whole(store, target):
    """Context changes nothing for ordinary code: the accepted text is stored as it was."""
    b, a = line_context("def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n")
    s = Served(id="s2", scope="/r", path="m.py", language_id="python", proposer="suffix",
               target="llama:x", text="a + b", before=b, after=a)
    doc = SuggestionStore(store).event(s, "accepted", tokenize=target.tokenize,
                                       fingerprint=target.fingerprint)
    assert store.document_text(doc) == "a + b"


def test_line_context_keeps_the_lines_a_rule_may_read():
    """line_context keeps at most 20 lines before a value (ending with the line that names the
    key) and the rest of the value's line after it."""
    before, after = line_context("x\n" * 100 + "# the key is\n# ab", "cd\nrest\nmore")
    assert before.endswith("# the key is\n# ab") and before.count("\n") <= 20
    assert after == "cd"


# -- .env* files are credential files ------------------------------------------------------


@pytest.mark.parametrize("name", [".envrc", ".env", ".env.local", ".env.production",
                                  "sub/.envrc"])
def test_env_files_are_not_indexed(tmp_path, name):
    """.env, .env.local, .env.production, .envrc (also in a subfolder) are never indexed;
    .env.example and ordinary sources are."""
    repo = make_repo(tmp_path / "r", {name: "export DB_HOST=db\n", "a.py": "x = 1\n",
                                      ".env.example": "DB_HOST=\n"})
    rels = {rel for rel, _ in iter_files(repo)}
    assert name not in rels and "a.py" in rels and ".env.example" in rels


# -- a maintained provider table: Microsoft's secret masker ---------------------------------
#
# Evaluated against our rules on the planted set (issue 34): detect-secrets 1.5.0 and
# bc-detect-secrets 1.5.52 scanning files as designed catch 32 of 106 texts, Microsoft's
# secret masker 9, ours all 106; none catches one ours misses. The masker's precisely
# classified table knows formats ours did not (Azure identifiable keys, NuGet, Azure DevOps
# PATs), unquoted and with no keyword: it runs as one more provider table. Values are
# random in each format's shape.

_B64CHARS = ALNUM + "+/"
MS_FORMATS = {
    "azure_storage_identifiable": _r(76, _B64CHARS) + "+ASt" + _r(5, _B64CHARS) + "A==",
    "azure_function_identifiable": _r(44, _TOK) + "AzFu" + _r(5, _TOK) + "Q==",
    "nuget_api_key": "oy2" + _r(43, string.ascii_lowercase + "234567"),
    "azure_devops_pat": _r(52, string.ascii_lowercase + "234567"),
}


@pytest.mark.parametrize("cls", MS_FORMATS)
def test_formats_of_the_microsoft_table_are_redacted(cls):
    """Each credential format of Microsoft's provider table is replaced by the redaction marker,
    with the prefilter on and off alike."""
    value = MS_FORMATS[cls]
    text = f"use {value} for the deploy\n"
    out = redact(text)
    assert out.text == f"use {REDACTED} for the deploy\n", out.text
    assert redact(text, prefilter=False) == out


def test_a_password_with_an_ampersand_or_named_by_words_then_a_colon_is_redacted():
    """From a re-check of the fourth run: a value holding "&" ended at it ("wifi password:
    Bv83&rtLmQ" was stored: "Bv83" is too short to be one), and "passphrase for the gpg key:
    PW" (words, then a colon) was not read as prose. "&&" still ends a value, and a word
    that is no secret stays."""
    cases = {
        "wifi password: Bv83&rtLmQ": "wifi password: [REDACTED]",
        "my password is Bv83&rtLmQ": "my password is [REDACTED]",
        "ssh root@10.0.0.5 (pass: Kx2&pq9Lm)": "ssh root@10.0.0.5 (pass: [REDACTED])",
        "passphrase for the gpg key: Jm3!oPq8Rs": "passphrase for the gpg key: [REDACTED]",
        "the password is Hunter2x && make deploy": "the password is [REDACTED] && make deploy",
        "password for the user: required": "password for the user: required",
        "the token for the API: see the vault": "the token for the API: see the vault",
    }
    for line, want in cases.items():
        for text in (line, line + "\n"):
            got = redact(text, filename="notes.md").text
            assert got == text.replace(line, want), (line, got)
            assert redact(text, filename="notes.md", prefilter=False).text == got
