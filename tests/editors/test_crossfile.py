"""Cross-file context on the real Target and a real Completer (editors/crossfile.py):
snippets of the scope's other open buffers in the prompt, before the window, within
their budget, stable while typing (KV reuse), off by the setting, gone on close, and
never less redacted than the history."""

from __future__ import annotations

from dataclasses import replace

import pytest

from assistd.runtime.runtime import Runtime, open_store
from editors import crossfile
from editors.completer import Completer, Request
from editors.settings import Settings, parse_settings
from tests.conftest import make_repo

SETTINGS = Settings(max_prompt_tokens=512, max_tokens=8, max_latency_ms=0, cross_file_tokens=160)

# The document being typed in, and another open buffer of its repository that shares
# its identifiers (the snippet the prompt should hold).
DOC = ("from shapes import make_polygon\n\n\n"
       "def polygon_area(vertices):\n"
       "    poly = make_polygon(vertices)\n"
       "    return poly.")
SHAPES = ("class Polygon:\n"
          "    def __init__(self, vertices):\n"
          "        self.vertices = list(vertices)\n\n"
          "    def shoelace_area(self):\n"
          "        pts = self.vertices\n"
          "        return abs(sum(x0 * y1 - x1 * y0 for (x0, y0), (x1, y1)\n"
          "                       in zip(pts, pts[1:] + pts[:1]))) / 2\n\n\n"
          "def make_polygon(vertices):\n"
          "    return Polygon(vertices)\n")


@pytest.fixture
def completer(target, tmp_path):
    # The session's Target in a runtime of the test's own, shared as the daemon shares it.
    rt = Runtime(target, open_store(tmp_path / "c.db"))
    c = Completer(SETTINGS, shared=rt)
    c.open()
    yield c
    c.close()
    rt.store.close()


@pytest.fixture
def prompts(completer, monkeypatch):
    """The prompt of every Target call, as the runtime got it (a spy: the call goes on)."""
    seen = []
    run = completer.runtime.run

    def spy(ids, *args, **kwargs):
        seen.append(list(ids))
        return run(ids, *args, **kwargs)

    monkeypatch.setattr(completer.runtime, "run", spy)
    return seen


def repo_with(tmp_path, name="r"):
    return make_repo(tmp_path / name, {"geometry.py": DOC, "shapes.py": SHAPES})


def request(repo, text=DOC, buffers=None):
    return Request(uri=(repo / "geometry.py").as_uri(), text=text, offset=len(text),
                   language="python", buffers=buffers or {})


def test_prompt_holds_a_similar_snippet_of_the_scopes_other_buffer_only(
        completer, prompts, tmp_path):
    """The prompt holds a similar snippet of another open buffer of the same repository, headed
    by its path as a Python comment, before the document (headed too); another repository's
    buffer never appears."""
    repo = repo_with(tmp_path)
    other = make_repo(tmp_path / "other", {"polygons.py": SHAPES.replace("Polygon", "Shape")})
    req = request(repo, buffers={(repo / "shapes.py").as_uri(): SHAPES, (other / "polygons.py")
                                 .as_uri(): SHAPES.replace("Polygon", "Shape")})
    assert completer.complete(req).source == "target"
    text = completer.target.detokenize(prompts[-1])
    # Headed by its path in a Python comment, before the document (headed too).
    assert "# shapes.py\nclass Polygon:" in text
    assert text.index("def shoelace_area") < text.index("# geometry.py\n" + DOC)
    assert text.endswith(DOC)
    assert "Shape" not in text.replace("shapes", "")  # the other repository's text: never
    assert "polygons.py" not in text


def test_cross_file_part_holds_its_budget(completer, prompts, tmp_path):
    """The cross-file part holds crossFileTokens and the prompt maxPromptTokens, the part first;
    a small prompt budget caps the part at half of it."""
    repo = repo_with(tmp_path)
    # Many similar buffers: far more than the budget.
    buffers = {(repo / f"shapes_{i}.py").as_uri(): SHAPES * 6 for i in range(6)}
    completer.complete(request(repo, buffers=buffers))
    pick = completer.crossfile.pick((repo / "geometry.py").as_uri())
    assert pick.chunks and 0 < len(pick.ids) <= SETTINGS.cross_file_tokens
    assert len(prompts[-1]) <= SETTINGS.max_prompt_tokens
    assert prompts[-1][:len(pick.ids)] == pick.ids  # the prompt starts with it (no BOS here)
    # A small prompt budget caps the part at half of it, whatever crossFileTokens says.
    completer.configure(replace(SETTINGS, max_prompt_tokens=120, cross_file_tokens=10_000))
    completer.complete(request(repo, DOC + "a", buffers=buffers))
    assert len(completer.crossfile.pick((repo / "geometry.py").as_uri()).ids) <= (120 - 1) // 2
    assert len(prompts[-1]) <= 120


def test_typing_reuses_the_whole_cross_file_part_from_the_kv_cache(completer, prompts, tmp_path):
    """Typing reuses the cross-file part and the window before the cursor from the KV cache
    (only new tokens evaluated); a small edit of the other buffer keeps the choice; far down the
    document it is chosen again."""
    repo = repo_with(tmp_path)
    buffers = {(repo / "shapes.py").as_uri(): SHAPES}
    first = completer.complete(request(repo, buffers=buffers))
    cross = completer.crossfile.pick((repo / "geometry.py").as_uri()).ids
    assert len(cross) > 20
    typed = "z" if not first.text.startswith("z") else "q"  # not type-through: a Target call
    second = completer.complete(request(repo, DOC + typed, buffers=buffers))
    assert second.source == "target"
    assert prompts[1][:len(cross)] == prompts[0][:len(cross)] == cross
    # Typing only appended: the cross-file part and the window before the cursor are
    # all reused, not evaluated again.
    assert second.ledger.prompt_tokens_reused >= len(prompts[0]) - 1
    # Another buffer edited a little keeps the choice (and the cache); a long way down
    # the document the choice is made again.
    completer.complete(request(repo, DOC + typed + "x", buffers={
        (repo / "shapes.py").as_uri(): SHAPES + "\n# tweak\n"}))
    assert prompts[2][:len(cross)] == cross
    far = DOC + "\n" + "".join(f"value_{i} = {i}\n" for i in range(40)) + "poly."
    completer.complete(request(repo, far, buffers=buffers))
    assert completer.crossfile.pick((repo / "geometry.py").as_uri()).line == far.count("\n")


def test_a_source_rewritten_is_chosen_again(completer, prompts, tmp_path):
    """When the other buffer is rewritten the snippet is chosen again from its new text."""
    repo = repo_with(tmp_path)
    uri = (repo / "shapes.py").as_uri()
    completer.complete(request(repo, buffers={uri: SHAPES}))
    rewritten = ("def polygon_area(vertices):\n    poly = make_polygon(vertices)\n"
                 "    return poly.perimeter_length_in_metres()\n")
    completer.complete(request(repo, DOC + "z", buffers={uri: rewritten}))
    text = completer.target.detokenize(prompts[-1])
    assert "shoelace" not in text and "perimeter_length_in_metres" in text


def test_setting_turns_it_off(completer, prompts, tmp_path):
    """crossFileTokens 0 (the default; negative falls back to it) turns cross-file context off:
    the prompt is the document window alone."""
    s, warnings = parse_settings({"assistd": {"crossFileTokens": 0}}, SETTINGS)
    assert s.cross_file_tokens == 0 and not warnings
    bad = parse_settings({"crossFileTokens": -1})[0]
    assert bad.cross_file_tokens == Settings.cross_file_tokens == 0  # off by default
    completer.configure(s)
    repo = repo_with(tmp_path)
    completer.complete(request(repo, buffers={(repo / "shapes.py").as_uri(): SHAPES}))
    assert completer.target.detokenize(prompts[-1]) == DOC  # the prompt of before: the window
    assert completer.crossfile.pick((repo / "geometry.py").as_uri()) is None


def test_a_closed_buffer_leaves_the_ring(completer, prompts, tmp_path):
    """A closed buffer leaves the cross-file sources and its text the prompt; closing the
    document drops its pick."""
    repo = repo_with(tmp_path)
    shapes = (repo / "shapes.py").as_uri()
    completer.complete(request(repo, buffers={shapes: SHAPES}))
    assert completer.state()["crossfile_sources"] == 1
    completer.drop_buffer(shapes)
    assert completer.state()["crossfile_sources"] == 0
    completer.complete(request(repo, DOC + "z"))
    assert "Polygon" not in completer.target.detokenize(prompts[-1])
    completer.drop_buffer((repo / "geometry.py").as_uri())
    assert completer.state()["crossfile_picks"] == 0


def test_snippets_pass_the_history_secret_filter(completer, prompts, tmp_path):
    """A secret in another buffer's snippet is redacted before it reaches the prompt."""
    repo = repo_with(tmp_path)
    secret = "Wq7-hunter2-Zr"
    body = SHAPES + f'\ndb_password = "{secret}"\npolygon_db = make_polygon(vertices)\n'
    completer.complete(request(repo, buffers={(repo / "shapes.py").as_uri(): body}))
    text = completer.target.detokenize(prompts[-1])
    assert 'db_password = "[REDACTED]"' in text and secret not in text


def test_headers_are_comments_of_the_files_language():
    """Snippet headers are the path as a comment in the file's language: # for Python and
    Makefile, // for Rust, -- for Lua, an HTML comment for Markdown."""
    assert crossfile.header("pkg/a.py") == "# pkg/a.py\n"
    assert crossfile.header("src/main.rs") == "// src/main.rs\n"
    assert crossfile.header("init.lua") == "-- init.lua\n"
    assert crossfile.header("Makefile") == "# Makefile\n"
    assert crossfile.header("docs/x.md") == "<!-- docs/x.md -->\n"


def test_fim_layout_puts_the_snippets_before_the_prefix_token(completer, tmp_path, monkeypatch):
    """No installable model declares FIM tokens (SmolLM2 and Gemma 3 270M have none), so
    the capability is patched on the real Target to check the layout: [BOS] snippets
    <fim_pre> prefix <fim_suf> suffix <fim_mid> (llama.cpp's /infill puts input_extra
    there)."""
    t = completer.target
    repo = repo_with(tmp_path)
    monkeypatch.setattr(t, "fim_tokens", lambda: (7, 8, 9))
    seen = []
    run = completer.runtime.run
    monkeypatch.setattr(completer.runtime, "run",
                        lambda ids, *a, **k: (seen.append(ids), run(ids, *a, **k))[1])
    doc = DOC + "\n\nprint(polygon_area([(0, 0), (1, 0), (0, 1)]))\n"
    completer.complete(Request(uri=(repo / "geometry.py").as_uri(), text=doc, offset=len(DOC),
                               language="python", buffers={(repo / "shapes.py").as_uri(): SHAPES}))
    cross = completer.crossfile.pick((repo / "geometry.py").as_uri()).ids
    assert cross and seen[-1] == [*cross, 7, *t.tokenize(DOC), 8, *t.tokenize(doc[len(DOC):]), 9]
