"""Issue 34 (hardening), class 2: cross-file context sends only what the history keeps.

With ``crossFileTokens`` > 0 and a remote Target, a break-it pass saw the text of an open
``.env``, ``server.key``, a ``.gitignore``d file, a file in a ``.gitignore``d folder and
``.git/config`` reach the server: the open buffers were chosen by identifier overlap only.
Now a buffer passes the history's own path rules (:class:`storage.walk.IgnoreRules`:
credential files, ignore files, ``.git/``) before it is a source, and its snippets the
secret filter.

Real parts: `assistd lsp` in its own process driven by pytest-lsp's client, a real
llama-cpp-python server (embedded model) on loopback, and between them
:class:`~tests.targets.test_remote_context.RecordingProxy`, which records every body the
server received: the prompt the Target saw."""

from __future__ import annotations

import pytest

from harness.lsp import inline, lsp_session, open_doc
from tests.conftest import make_repo
from tests.targets.test_remote_context import RecordingProxy

SECRET = "sk-live-9f8e7d6c5b4a39281706f5e4d3c2b1a0"
DOC = ("from shapes import make_polygon\n\n\n"
       "def polygon_area(vertices):\n"
       "    poly = make_polygon(vertices)\n"
       "    return poly.")


def _twin(marker: str) -> str:
    """Lines as similar to DOC's as the kept buffer's, naming ``marker`` (which must never
    reach the server)."""
    return (f"def make_polygon(vertices, {marker}=None):\n"
            f"    poly = polygon_area(vertices)  # {marker}\n"
            f"    return make_polygon(vertices).shoelace_area({marker})\n")


# The buffers the history refuses (path -> its marker), by the rule that refuses each.
REFUSED = {
    ".env": "marker_env_7f3a",                   # a credential file (built-in rule)
    "certs/server.key": "marker_key_2b9c",       # *.key (built-in rule)
    "ignored_helper.py": "marker_ignored_41d8",  # the repository's .gitignore
    "private/notes.py": "marker_folder_93e1",    # in a .gitignore'd folder
    ".git/config": "marker_git_c07d",            # git's own folder
}
KEPT = ("class Polygon:\n"
        f"    api_key = \"{SECRET}\"\n"
        "    def shoelace_area(self, vertices):\n"
        "        return polygon_area(vertices)\n\n\n"
        "def make_polygon(vertices):\n"
        "    return Polygon(vertices)\n")


@pytest.fixture
def proxy(llama_server):
    p = RecordingProxy(llama_server)
    yield p
    p.stop()


async def test_cross_file_context_sends_only_buffers_the_history_keeps(proxy, tmp_path):
    """Over LSP to a remote server, only open buffers the history would keep are sent as
    cross-file context (secret-filtered, under their path); gitignored, private and refused
    paths send neither text nor header."""
    repo = make_repo(tmp_path / "repo", {
        "geometry.py": DOC, "shapes.py": KEPT, ".gitignore": "ignored_helper.py\nprivate/\n",
        **{rel: _twin(marker) for rel, marker in REFUSED.items()}})
    settings = {"backend": "openai", "targetUrl": proxy.url, "crossFileTokens": 480,
                "maxPromptTokens": 1024, "maxTokens": 4}
    async with lsp_session(tmp_path / "h.db", root=repo, settings=settings) as (client, _):
        for rel, marker in REFUSED.items():
            open_doc(client, repo / rel, _twin(marker), language="plaintext")
        open_doc(client, repo / "shapes.py", KEPT)
        uri = open_doc(client, repo / "geometry.py", DOC)
        await inline(client, uri, 5, len("    return poly."))
    prompts = proxy.prompts()
    assert prompts, "no prompt reached the server"
    sent = prompts[-1]
    # The kept buffer went, under its path, its secret filtered: the context is on.
    assert "# shapes.py\nclass Polygon:" in sent and "def shoelace_area" in sent
    assert 'api_key = "[REDACTED]"' in sent
    assert sent.endswith(DOC)
    raw = b"".join(body for _, body in proxy.bodies)  # nothing sent anywhere holds them
    leaked = [rel for rel, marker in REFUSED.items() if marker.encode() in raw]
    assert leaked == []
    assert SECRET.encode() not in raw
    for rel in REFUSED:
        assert f" {rel}\n" not in sent  # not even the header naming it
