"""Privacy of the history: scopes never leak into each other, secrets never enter the file.

Real model tokenizer, real SQLite file, real repositories and transcripts on disk.
"""

from __future__ import annotations

import json
import random
import string

import numpy as np

from proposers import make_proposer
from proposers.index import HistoryIndex
from storage.indexer import index_repository
from storage.ingest import TranscriptIngester
from storage.store import HistoryStore
from tests.conftest import make_repo


def _proposal(store, scope, target, prompt):
    index = HistoryIndex()
    index.load(store, scope, target.fingerprint)
    prop = make_proposer("ngram", history=index, alpha=1.0)
    draft = prop.propose(np.array(target.tokenize(prompt), dtype=np.int64), 16, scope=scope)
    return "" if draft is None else target.detokenize(list(draft.tokens))


def test_text_of_one_repository_is_never_drafted_in_another(store, tmp_path, target):
    """A distinctive line from repository A (a file, and an agent transcript recorded in
    A) is drafted in A and never in B, though B's prompt is its exact beginning."""
    marker = "zebra_quantum_flux = compute_the_marmalade_vector(aardvark, 0x5eed)\n"
    prompt = "zebra_quantum_flux = compute_the"
    a = make_repo(tmp_path / "A", {"a.py": "import os\n" + marker})
    b = make_repo(tmp_path / "B", {"b.py": "import sys\nprint('B')\n"})
    for repo in (a, b):
        index_repository(store, repo, target.tokenize, target.fingerprint)
    session = tmp_path / "claude" / "s.jsonl"
    session.parent.mkdir()
    session.write_text(json.dumps({
        "type": "assistant", "cwd": str(a), "uuid": "u1",
        "message": {"id": "m1", "content": [{"type": "text", "text": "Run:\n" + marker}]},
    }) + "\n")
    TranscriptIngester(store, target.tokenize, target.fingerprint).ingest(session)

    scope_a, scope_b = str(a.resolve()), str(b.resolve())
    assert "_marmalade_vector" in _proposal(store, scope_a, target, prompt)
    assert "marmalade" not in _proposal(store, scope_b, target, prompt)
    in_b = [store.document_text(i) for i, _, _ in store.token_arrays(scope_b, target.fingerprint)]
    assert all("marmalade" not in t for t in in_b)
    kinds_a = {r[0] for r in store.db.execute(
        "select source_kind from documents where scope = ?", [scope_a])}
    assert kinds_a == {"repo", "transcript"}


def _rand(rng, alphabet, n):
    return "".join(rng.choice(alphabet) for _ in range(n))


def test_planted_secrets_never_reach_the_database_file(tmp_path, target):
    """Keys of several kinds planted in repository files and in agent transcripts (a
    tool call's env dump, a pasted key in prose) are redacted before storage: none of
    their values occurs anywhere in the bytes of the SQLite file or its WAL."""
    rng = random.Random(11)
    up, al = string.ascii_uppercase + string.digits, string.ascii_letters + string.digits
    aws_id = "AKIA" + _rand(rng, up, 16)
    aws_secret = _rand(rng, al + "/+", 40)
    github = "ghp_" + _rand(rng, al, 36)
    slack = "xoxb-" + "-".join(_rand(rng, string.digits, 12) for _ in range(2)) + "-" + _rand(rng, al, 24)
    stripe = "sk_live_" + _rand(rng, al, 99)
    openai = "sk-proj-" + _rand(rng, al, 40) + "T3BlbkFJ" + _rand(rng, al, 40)
    db_password = _rand(rng, al, 12) + "!9x"
    pem_body = [_rand(rng, al + "+/", 64) for _ in range(6)]
    secrets = [aws_id, aws_secret, github, slack, stripe, openai, db_password, *pem_body]

    repo = make_repo(tmp_path / "repo", {
        "settings.py": f'AWS_ACCESS_KEY_ID = "{aws_id}"\nAWS_SECRET_ACCESS_KEY = "{aws_secret}"\n'
                       f'GITHUB_TOKEN = "{github}"\n',
        "deploy/config.yaml": f"slack_token: {slack}\nstripe_key: {stripe}\n",
        "notes/key.txt": "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(pem_body)
                         + "\n-----END RSA PRIVATE KEY-----\n",
        "app.py": "def ok():\n    return 1\n",
    })
    session = tmp_path / "sessions" / "s.jsonl"
    session.parent.mkdir()
    session.write_text("\n".join(json.dumps(r) for r in [
        {"type": "assistant", "cwd": str(repo), "uuid": "u1", "message": {"id": "m1", "content": [
            {"type": "tool_use", "id": "t1", "name": "Bash",
             "input": {"command": f"export OPENAI_API_KEY={openai}\nDB_PASSWORD={db_password} ./run"}}]}},
        {"type": "assistant", "cwd": str(repo), "uuid": "u2", "message": {"id": "m2", "content": [
            {"type": "text", "text": f"I set `api_key = \"{openai}\"` and the token {github}."}]}},
    ]) + "\n")

    db = tmp_path / "h.db"
    store = HistoryStore(db)
    rep = index_repository(store, repo, target.tokenize, target.fingerprint)
    tr = TranscriptIngester(store, target.tokenize, target.fingerprint).ingest(session)
    assert rep.redactions >= 6 and tr.redactions >= 3
    # The code around the secrets is kept.
    texts = "\n".join(r[0] for r in store.db.execute("select text from documents"))
    assert "AWS_SECRET_ACCESS_KEY = " in texts and "def ok():" in texts
    store.close()

    raw = b"".join(p.read_bytes() for p in tmp_path.glob("h.db*"))
    leaked = [s for s in secrets if s.encode() in raw]
    assert leaked == [], f"{len(leaked)} planted secret values are in the database file"
