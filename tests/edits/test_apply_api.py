"""POST /v1/assistd/apply on a real Service and the real embedded Target, through the API's
own app (build_app's route), error handlers and token, and the request's path and scope
rules."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from assistd.ground.errors import InputError
from assistd.serving import api
from assistd.serving.apply_api import edit_target
from assistd.serving.config import Config
from assistd.serving.service import Service
from assistd.targets.spec import TargetSpec
from tests.conftest import make_repo, on_remote_target

TOKEN = "apply-test-token"
CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
BLOCK = "<<<<<<< SEARCH\n    return a - b\n=======\n    return a - b  # minus\n>>>>>>> REPLACE\n"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """A started Service (the embedded model, n_ctx 1024) behind build_app's app: the
    API's route, error handlers and bearer token."""
    folder = tmp_path_factory.mktemp("apply-api")
    service = Service(Config(target=TargetSpec(n_ctx=1024), db=str(folder / "history.db")))
    service.start()
    app = api.build_app(service, TOKEN)
    try:
        with TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1",
                        headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            yield c
    finally:
        service.close()


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "repo", {"calc.py": CALC, ".env": "KEY=1\n"})


def test_blocks_come_back_as_a_diff_and_the_file_is_untouched(client, repo):
    """SEARCH/REPLACE through the API: 200, a git-style diff, the scope found from the
    file's repository (.git), both parse checks ok; the file is not written."""
    before = (repo / "calc.py").read_bytes(), (repo / "calc.py").stat().st_mtime_ns
    r = client.post("/v1/assistd/apply", json={"path": str(repo / "calc.py"), "edit": BLOCK})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "assistd.apply" and body["method"] == "search_replace"
    assert body["path"] == "calc.py" and body["text"] is None
    assert "-    return a - b\n+    return a - b  # minus\n" in body["diff"]
    assert body["after"]["ok"] and not body["broke"] and body["usage"] is None
    assert ((repo / "calc.py").read_bytes(), (repo / "calc.py").stat().st_mtime_ns) == before


@pytest.mark.parametrize("body,status,words", [
    ({"path": ".env", "edit": BLOCK}, 400, "ignore rules exclude it"),
    ({"path": "calc.py", "edit": BLOCK}, 400, "is relative"),
    ({"path": "calc.py", "edit": "<<<<<<< SEARCH\nnope\n=======\n\n>>>>>>> REPLACE\n"}, 400,
     "block 1 (line 1 of the edit): its SEARCH text matches nothing in calc.py"),
    ({"path": "calc.py", "edit": BLOCK, "colour": "red"}, 400, "colour"),
    ({"path": "calc.py", "edit": BLOCK, "output": "html"}, 400, "output"),
])
def test_errors_are_openai_shaped_400s_that_say_why(client, repo, body, status, words):
    """A refused file, a relative path without repo, a block that misses, an unknown key,
    a bad output: 400 with OpenAI's error object naming the cause."""
    if not (body["path"] == "calc.py" and "relative" in words):
        body = {**body, "repo": str(repo)}
    r = client.post("/v1/assistd/apply", json=body)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]


@pytest.mark.skipif(on_remote_target(), reason="the prediction counts are the local engine's")
def test_a_lazy_snippet_is_merged_by_the_daemons_model_with_the_file_as_prediction(client,
                                                                                  repo):
    """The real model path: a lazy snippet goes to the Target through the daemon's queue,
    the answer comes back out of its fence, and usage carries OpenAI's prediction counts
    (some prediction tokens accepted: the answer copies the file's first lines). The
    135M model's merge is not judged here, only that the path runs end to end."""
    snippet = "def add(a, b):\n    return a + b + 0\n# ... existing code ...\n"
    r = client.post("/v1/assistd/apply", json={"path": "calc.py", "repo": str(repo),
                                               "edit": snippet, "output": "text"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["method"] == "model" and body["lazy_markers"] == [
        {"line": 3, "text": "# ... existing code ..."}]
    details = body["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0
    assert body["usage"]["completion_tokens"] > 0 and body["text"]
    assert (repo / "calc.py").read_text() == CALC


def test_edit_target_takes_relative_paths_from_repo_or_cwd_and_finds_the_root(tmp_path):
    """A relative path from repo, else from cwd; the scope is repo, else the nearest
    .git above the file's directory; neither for a relative path is an error."""
    root = make_repo(tmp_path / "r", {"pkg/m.py": "x = 1\n"})
    assert edit_target("pkg/m.py", str(root)) == (root / "pkg" / "m.py", root)
    assert edit_target("m.py", None, cwd=root / "pkg") == (root / "pkg" / "m.py", root)
    assert edit_target(str(root / "pkg" / "m.py"), None) == (root / "pkg" / "m.py", root)
    with pytest.raises(InputError, match="is relative"):
        edit_target("m.py", None)


def test_a_file_in_no_repository_needs_repo(tmp_path):
    """Without ``repo``, a file outside any git repository is refused (an agent names the
    folder it may read); with it, it is read."""
    from assistd.serving.apply_api import edit_target

    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "a.py").write_text("x = 1\n")
    with pytest.raises(InputError, match="no git repository"):
        edit_target(str(loose / "a.py"), None)
    assert edit_target(str(loose / "a.py"), str(loose)) == (loose / "a.py", loose)
