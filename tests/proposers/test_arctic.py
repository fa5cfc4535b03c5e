"""peer:arctic / peer:arctic-tree: the real Arctic Inference 0.3.0 build, and its builder.

The build (pip download of the sdist, CMake + nanobind, ~30 s on 2 cores) runs once per
session into the session's cache dir; without a network, cmake, nanobind or a C++
compiler the tests that need it are skipped with that reason. The adapter's drafts are
compared with Arctic's own Python API (``SuffixDecodingCache``, from the same sdist) fed
the same tokens.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from assistd.ground.errors import InputError
from assistd.measure.arctic import PeerBuildError, build
from proposers import make_proposer
from proposers.arctic import MODULE_DIR, MODULE_NAME, VERSION, built_module, peer_dir
from proposers.index import HistoryIndex

DATA = Path(__file__).parents[1] / "data" / "replay"
SCOPE = "s"

# A small history with branching continuations: after "1 2 3", 4 twice and 7 once.
DOCS = [
    [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 9, 9, 9],
    [8, 1, 2, 3, 7, 7, 7, 1, 2, 3, 4, 5, 6, 6],
    [5, 6, 1, 2, 3, 4, 8, 8, 2, 3, 4, 5, 6, 1],
]
CONTEXTS = [  # growing (the request tree is extended), then a new request
    [9, 1, 2, 3],
    [9, 1, 2, 3, 4],
    [9, 1, 2, 3, 4, 5, 6],
    [9, 1, 2, 3, 4, 5, 6, 1, 2],
    [3, 3, 3, 3, 3, 3, 2, 3, 4, 5, 6, 1, 2, 3],
    list(range(20, 100)) + [1, 2, 3],  # longer than the trees' depth of 64
]


@pytest.fixture(scope="session")
def arctic():
    """Build once into the session's cache dir; skip when this machine cannot."""
    try:
        build()
    except PeerBuildError as e:
        if e.step in ("download", "tools"):
            pytest.skip(f"Arctic Inference 0.3.0 cannot be built here: {e}")
        raise
    sys.path.insert(0, str(peer_dir()))  # Arctic's own Python API, beside the module
    from arctic_inference.suffix_decoding.cache import SuffixDecodingCache

    yield SuffixDecodingCache
    sys.path.remove(str(peer_dir()))


def history() -> HistoryIndex:
    h = HistoryIndex()
    for i, doc in enumerate(DOCS):
        h.put(SCOPE, i + 1, doc, f"doc{i}")
    return h


def reference(cache_cls, context, k, tree):
    """Arctic's own API, as its vLLM runner uses it: earlier responses in the global
    tree, the request's tokens as its prompt, the last 64 tokens as the pattern."""
    cache = cache_cls(max_tree_depth=64, max_cached_requests=100000)
    for i, doc in enumerate(DOCS):
        cache.start_request(f"d{i}", [])
        cache.add_active_response(f"d{i}", doc)
        cache.stop_request(f"d{i}")
    cache.start_request("live", list(context))
    return cache.speculate("live", list(context[-64:]), max_spec_tokens=k, max_spec_factor=1.0,
                           max_spec_offset=0.0, min_token_prob=0.1, use_tree_spec=tree)


def branches(tokens, parents, cumulative) -> dict[tuple, float]:
    """{token path from the root: cumulative estimate}, for either convention."""
    out, path = {}, {}
    for i, p in enumerate(list(parents)):
        path[i] = (path[p] if p >= 0 else ()) + (int(tokens[i]),)
        out[path[i]] = float(cumulative[i])
    return out


def check_tree(d, k):
    """Our convention: topological, siblings distinct, depth-first, likeliest child first."""
    parents = d.parents.tolist()
    cum = d.cumulative()
    assert all(p < i for i, p in enumerate(parents))
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    for p, cs in kids.items():
        toks = [int(d.tokens[c]) for c in cs]
        assert len(set(toks)) == len(toks), (p, toks)
        assert all(cum[a] >= cum[b] for a, b in zip(cs, cs[1:])), (p, cs, cum)
    for i, p in enumerate(parents):  # depth-first: a node's first child comes right after it
        if i in kids:
            assert kids[i][0] == i + 1
    assert d.depth <= k


@pytest.mark.parametrize("name,tree", [("peer:arctic", False), ("peer:arctic-tree", True)])
@pytest.mark.parametrize("k", [64, 3])
def test_drafts_equal_arctics_own_api(arctic, name, tree, k):
    """peer:arctic and peer:arctic-tree, at k 64 and 3, draft on a growing context exactly what
    Arctic's own API returns for the same history: the same branches with cumulative
    probabilities within 1e-5, the same match length and (uncut) score, and None where Arctic
    has nothing."""
    p = make_proposer(name, history=history())
    seen = 0
    for ctx in CONTEXTS:
        d = p.propose(np.array(ctx), k, scope=SCOPE)
        ref = reference(arctic, ctx, 64 if tree else k, tree)
        if not ref.token_ids:
            assert d is None
            continue
        seen += 1
        want = branches(ref.token_ids, ref.parents, ref.probs)
        if tree:  # our adapter cuts nodes deeper than k
            want = {b: c for b, c in want.items() if len(b) <= k}
        got = branches(d.tokens, d.parents if d.parents is not None else
                       np.arange(-1, len(d.tokens) - 1), d.cumulative())
        assert got.keys() == want.keys(), ctx
        for b in want:
            assert got[b] == pytest.approx(want[b], rel=1e-5)
        assert d.match_len == ref.match_len
        if not tree or k == 64:
            assert d.score == pytest.approx(ref.score, rel=1e-5)
    assert seen >= 4  # the cases draft something


def test_tree_mode_is_a_valid_tree_in_our_convention(arctic):
    """Tree mode over histories continuing a prefix with 20 21 22 (twice) and 30 31: a valid
    tree in our parent convention, tokens [20, 21, 22, 30, 31], parents [-1, 0, 1, -1, 3],
    probabilities [2/3, 1, 1, 1/3, 1]; at k 1 only the two first tokens."""
    prefix = list(range(10, 18))
    h = HistoryIndex()
    for i, doc in enumerate([prefix + [20, 21, 22], prefix + [30, 31], prefix + [20, 21, 22]]):
        h.put(SCOPE, i + 1, doc)
    p = make_proposer("peer:arctic-tree", history=h)
    d = p.propose(np.array(prefix), 64, scope=SCOPE)
    # m = 7 ("11 .. 17"): at most 7 nodes (match length x max_spec_factor), best first:
    # 20 21 22 (2/3 each), then 30 31 (1/3); depth-first, the likelier branch first.
    assert d.is_tree and d.source == "history" and d.match_len == 7
    check_tree(d, 64)
    assert d.tokens.tolist() == [20, 21, 22, 30, 31]
    assert d.parents.tolist() == [-1, 0, 1, -1, 3]
    assert d.probs == pytest.approx([2 / 3, 1, 1, 1 / 3, 1])
    assert d.score == pytest.approx(3 * 2 / 3 + 2 / 3)
    cut = p.propose(np.array(prefix), 1, scope=SCOPE)
    assert cut.depth == 1 and cut.tokens.tolist() == [20, 30] and cut.parents.tolist() == [-1, -1]


def test_history_changes_reach_the_global_tree(arctic):
    """A document put into the history index drafts through Arctic's global tree (at most
    match-length tokens: [43, 44]); once removed it drafts nothing."""
    h = HistoryIndex()
    p = make_proposer("peer:arctic", history=h)
    assert p.propose(np.array([40, 41, 42]), 8, scope=SCOPE) is None
    h.put(SCOPE, 7, [40, 41, 42, 43, 44, 45], "new")
    d = p.propose(np.array([40, 41, 42]), 8, scope=SCOPE)
    assert d.source == "history" and d.tokens.tolist() == [43, 44]  # m = 2: at most 2
    h.remove(7)
    assert p.propose(np.array([40, 41, 42]), 8, scope=SCOPE) is None


def test_build_is_reused(arctic):
    """A second build() returns the module already built without touching it (same mtime)."""
    first = built_module()
    stamp = first.stat().st_mtime_ns
    assert build() == first and first.stat().st_mtime_ns == stamp


def test_peers_build_says_reused_and_refuses_a_module_that_does_not_load(arctic, tmp_path):
    """A newcomer's broken ``_C*.so`` was reported as "built"; a reused build printed
    the same line as a fresh one."""
    cmd = [sys.executable, "-m", "assistd", "peers", "build", "arctic"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("already built: ")
    broken = tmp_path / "peers" / f"arctic-inference-{VERSION}" / MODULE_DIR
    broken.mkdir(parents=True)
    (broken / built_module().name).write_bytes(b"not an ELF file")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "ASSISTD_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "does not load" in r.stderr and "assistd peers build arctic" in r.stderr


def test_missing_build_is_a_clear_input_error(tmp_path, monkeypatch):
    """Without a build, peer:arctic raises an InputError naming `assistd peers build arctic`;
    `assistd replay --proposer peer:arctic` exits 2 with that line, no traceback, and builds
    nothing."""
    monkeypatch.setenv("ASSISTD_CACHE_DIR", str(tmp_path))
    monkeypatch.delitem(sys.modules, MODULE_NAME, raising=False)
    with pytest.raises(InputError, match="assistd peers build arctic"):
        make_proposer("peer:arctic", history=HistoryIndex())
    r = subprocess.run([sys.executable, "-m", "assistd", "replay", DATA / "chat.jsonl",
                        "--proposer", "peer:arctic", "--cost-model", "reference", "--json"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "ASSISTD_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "assistd peers build arctic" in r.stderr
    assert not (tmp_path / "peers").exists()  # nothing built, nothing left behind


def fake_sdist(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"arctic_inference-0.3.0/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_build_failures_name_the_step(tmp_path, monkeypatch):
    """An sdist without csrc/suffix_decoding fails at step extract; one whose C++ does not
    compile fails at step build quoting the compiler on bad.cc; nothing is left outside the
    cache dir and no module is registered."""
    monkeypatch.setenv("ASSISTD_CACHE_DIR", str(tmp_path / "cache"))
    empty = fake_sdist(tmp_path / "empty.tar.gz", {"README.md": "no sources\n"})
    with pytest.raises(PeerBuildError, match="has no csrc/suffix_decoding") as e:
        build(empty)
    assert e.value.step == "extract"
    broken = fake_sdist(tmp_path / "broken.tar.gz", {
        "csrc/suffix_decoding/CMakeLists.txt":
            "cmake_minimum_required(VERSION 3.18)\nproject(x CXX)\n"
            "add_library(_C MODULE bad.cc)\n",
        "csrc/suffix_decoding/bad.cc": "int f( { return 0; }\n",
    })
    with pytest.raises(PeerBuildError) as e:
        build(broken)
    if e.value.step == "tools":
        pytest.skip(f"no C++ toolchain: {e.value}")
    assert e.value.step == "build" and "cmake build failed" in str(e.value)
    assert "bad.cc" in str(e.value)  # the compiler's own words
    assert built_module() is None
    assert all(p.is_relative_to(tmp_path) for p in (tmp_path / "cache").rglob("*"))


def test_replay_runs_both_modes(arctic, tmp_path):
    """`assistd replay` with the two peers on a transcript fixture (the session's build)."""
    r = subprocess.run([sys.executable, "-m", "assistd", "replay", DATA / "claude_session.jsonl",
                        DATA / "chat.jsonl", "--proposer", "peer:arctic", "--proposer",
                        "peer:arctic-tree", "--proposer", "peer:suffixdecoding",
                        "--cost-model", "reference", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert list(out["proposers"]) == ["peer:arctic", "peer:arctic-tree", "peer:suffixdecoding"]
    for m in out["proposers"].values():
        assert m["committed_tokens"] == out["inputs"]["model_tokens"]
        assert m["tokens_per_call"] >= 1.0


# ------------------------------------------------ where our reading differs from the build

PRE = list(range(10, 18))  # a context suffix of 8 tokens, every document's start


def _pair(tree: bool, docs):
    h = HistoryIndex()
    for i, doc in enumerate(docs):
        h.put(SCOPE, i + 1, doc)
    ours = make_proposer("peer:suffixdecoding", history=h,
                         **({"tree": True, "max_nodes": 64} if tree else {}))
    real = make_proposer("peer:arctic-tree" if tree else "peer:arctic", history=h)
    ctx = np.array([99] + PRE)
    return ours.propose(ctx, 16, scope=SCOPE), real.propose(ctx, 16, scope=SCOPE)


# After PRE: 40 nine times in ten (each then followed by another token), 30 once: a node
# two deep on 40's branch has the estimate 0.9 x 1/9, min_token_prob (0.1) exactly. Arctic
# computes it in float32, the path as prob *= float(count) / count (0.9f * 0.11111111f =
# 0.1f: kept) and the tree as prob * count / float(count) (0.9f / 9.0f = 0.099999994:
# dropped); our reading, in float64, does the opposite in each mode.
BOUNDARY = [PRE + [40, 41 + i] for i in range(9)] + [PRE + [30, 31]]


@pytest.mark.parametrize("tree", [False, True])
def test_real_build_at_exactly_min_token_prob(arctic, tree):
    """At a node whose estimate is exactly min_token_prob (0.1), Arctic's float32 keeps it in
    path mode ([40, 41]) and drops it in tree mode ([40, 30, 31])."""
    _, real = _pair(tree, BOUNDARY)
    assert real.tokens.tolist() == ([40, 30, 31] if tree else [40, 41])


@pytest.mark.xfail(strict=True, reason="our reading (proposers/suffixdecoding.py) rounds the "
                   "estimates in float64, the real build in float32 (a different association "
                   "in path and tree mode), so a node of exactly min_token_prob goes the other "
                   "way; fix: the same float32 arithmetic")
@pytest.mark.parametrize("tree", [False, True])
def test_our_reading_matches_the_build_at_the_min_token_prob_boundary(arctic, tree):
    """Known difference (strict xfail): at the min_token_prob boundary our float64 reading
    decides the other way from Arctic's float32."""
    ours, real = _pair(tree, BOUNDARY)
    assert ours.tokens.tolist() == real.tokens.tolist()


# Two continuations seen once each: Arctic keeps a node behind its equals when its count
# rises to theirs (``_increment_count``), so among equal counts the continuation seen
# first comes first; our reading takes the smaller token id.
TIE = [PRE + [40, 41, 42], PRE + [30, 31, 32]]


def test_real_build_breaks_ties_by_first_occurrence(arctic):
    """Between equally frequent continuations Arctic takes the one it saw first: 40 41 42 or 30
    31 32 by document order, both in tree mode, 40's first."""
    _, real = _pair(False, TIE)
    assert real.tokens.tolist() == [40, 41, 42] and real.probs[0] == pytest.approx(0.5)
    _, real = _pair(False, TIE[::-1])
    assert real.tokens.tolist() == [30, 31, 32]
    _, real = _pair(True, TIE)
    assert real.tokens.tolist() == [40, 41, 42, 30, 31, 32]


@pytest.mark.xfail(strict=True, reason="our reading breaks ties between equal counts by the "
                   "smaller token id (its docstring: 'Arctic: hash-map order'); Arctic takes "
                   "the child that reached that count first; fix: break ties that way")
@pytest.mark.parametrize("tree", [False, True])
def test_our_reading_breaks_ties_as_the_build(arctic, tree):
    """Known difference (strict xfail): our reading breaks count ties by the smaller token id,
    Arctic by first occurrence."""
    ours, real = _pair(tree, TIE)
    assert ours.tokens.tolist() == real.tokens.tolist()


def test_a_bad_sdist_is_not_kept_for_the_next_build(tmp_path, monkeypatch):
    """A newcomer passed a .py file as --sdist: the build failed at extract, but the
    file stayed in the cache as the sdist, and every later plain build reused it."""
    monkeypatch.setenv("ASSISTD_CACHE_DIR", str(tmp_path / "cache"))
    bogus = tmp_path / "sample.py"
    bogus.write_text("print('not an sdist')\n")
    with pytest.raises(PeerBuildError, match=r"from --sdist .*sample\.py") as e:
        build(bogus)
    assert e.value.step == "extract"
    assert not any((peer_dir() / "sdist").glob("*.tar.gz"))
