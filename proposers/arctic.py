"""peer:arctic and peer:arctic-tree — the real Arctic Inference 0.3.0 SuffixDecoding.

The same comparison as ``peer:suffixdecoding`` (our reading of Arctic's rule), against
the real build: its C++ suffix trees (``arctic_inference.suffix_decoding._C``), built
into the user cache on request by ``assistd peers build arctic``
(:mod:`assistd.measure.arctic`; its code is never part of this repository).

Fed as Arctic's vLLM integration feeds its ``SuffixDecodingCache``: a per-request tree
holding the request's tokens (here the context: prompt and response so far, extended
in place while the context grows), and a global tree of earlier responses (here every
document of the history scope, one sequence each, added and removed as the
:class:`~proposers.index.HistoryIndex` changes). A round speculates on both from the
context's last ``max_tree_depth`` (64) tokens with Arctic's defaults (``max_spec_factor``
1, ``max_spec_offset`` 0, ``min_token_prob`` 0.1) and keeps the higher score, the
request's on ties (``SuffixDecodingCache.speculate``). ``max_spec_tokens`` is the node
budget (``max_nodes``, 64) and the caller's ``k``, whichever is smaller in path mode; in
tree mode ``k`` bounds the depth (deeper nodes are cut).

One difference, by necessity: Arctic's global tree also holds the active response,
which the replay puts in the history only once its turn is done.

Measured against our reading (replay of the shared transcripts, flat cost, k 16, 64
nodes): tokens per Target call 2.520 (path) and 2.551 (tree) here, 2.527 and 2.553 for
``peer:suffixdecoding``; the drafts differ at ~9% of positions, nearly all ties between
equal counts (Arctic: the child that reached the count first) and float32 rounding at
``min_token_prob`` (tests/proposers/test_arctic.py).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import platformdirs

from assistd.ground.errors import InputError
from proposers.base import Draft, Proposer, register

VERSION = "0.3.0"
SDIST_NAME = f"arctic_inference-{VERSION}.tar.gz"
MODULE_DIR = "arctic_inference/suffix_decoding"
MODULE_NAME = "arctic_inference.suffix_decoding._C"
BUILD_COMMAND = "assistd peers build arctic"
WINDOW = 256  # tokens compared to tell that a context extends the request held


def peer_dir() -> Path:
    """``<cache>/peers/arctic-inference-0.3.0``; ``<cache>``: ``$ASSISTD_CACHE_DIR``, else
    the user cache dir (as the converted torch weights)."""
    env = os.environ.get("ASSISTD_CACHE_DIR")
    cache = Path(env) if env else Path(platformdirs.user_cache_dir("assistd", appauthor=False))
    return cache / "peers" / f"arctic-inference-{VERSION}"


def built_module() -> Path | None:
    """The built extension's file, or None when it has not been built."""
    folder = peer_dir() / MODULE_DIR
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = folder / f"_C{suffix}"
        if path.is_file():
            return path
    return None


def load():
    """The built ``_C`` module (``SuffixTree``, ``Draft``). Raises :class:`InputError`
    naming the build command when it is not built, or the loader's error."""
    mod = sys.modules.get(MODULE_NAME)
    if mod is not None:
        return mod
    path = built_module()
    if path is None:
        raise InputError(f"peer:arctic needs Arctic Inference {VERSION}'s SuffixDecoding, "
                         f"built once into {peer_dir()}: run `{BUILD_COMMAND}`")
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    try:
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except ImportError as e:
        raise InputError(f"{path} does not load ({e}); delete {peer_dir()} and run "
                         f"`{BUILD_COMMAND}` again") from None
    sys.modules[MODULE_NAME] = mod  # so Arctic's own Python API finds the same module
    return mod


def to_draft(native, depth: int, source: str) -> Draft | None:
    """Arctic's ``Draft`` as ours, or None when empty.

    Arctic's ``probs`` are cumulative along a branch (its score is their sum) and its tree
    lists nodes in best-first pop order; ours are conditional (``probs[i]`` given the
    parent) and the tree depth-first, likeliest child first. Nodes deeper than ``depth``
    are cut (a chain keeps its first ``depth`` tokens)."""
    tokens = np.asarray(native.token_ids, dtype=np.int64)
    if not len(tokens):
        return None
    parents = np.asarray(native.parents, dtype=np.int64)
    cum = np.asarray(native.probs, dtype=np.float64)
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents.tolist()):
        children.setdefault(p, []).append(i)
    order, level, stack = [], {-1: 0}, [-1]
    while stack:  # depth-first; likeliest child first, Arctic's order on ties
        node = stack.pop()
        if node >= 0:
            order.append(node)
        kids = [c for c in children.get(node, []) if level[node] < depth]
        for c in kids:
            level[c] = level[node] + 1
        stack.extend(sorted(kids, key=lambda c: (cum[c], -c)))
    order = np.array(order, dtype=np.int64)
    new_index = {-1: -1, **{int(old): new for new, old in enumerate(order.tolist())}}
    new_parents = np.array([new_index[int(parents[o])] for o in order], dtype=np.int64)
    parent_cum = np.where(new_parents >= 0, cum[order][np.maximum(new_parents, 0)], 1.0)
    probs = cum[order] / parent_cum
    is_chain = bool((new_parents == np.arange(-1, len(order) - 1)).all())
    return Draft(tokens=tokens[order], probs=probs, source=source,
                 match_len=int(native.match_len), parents=None if is_chain else new_parents)


class _ArcticPeer(Proposer):
    """Arctic's two suffix trees over the request and the history scope. ``max_nodes``:
    ``max_spec_tokens`` (tokens); the other options are Arctic's, at its vLLM defaults.
    Raises :class:`InputError` (from :func:`load`) when the module is not built."""

    use_tree_spec: ClassVar[bool] = False

    def __init__(self, history=None, *, max_nodes: int = 64, max_tree_depth: int = 64,
                 max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
                 min_token_prob: float = 0.1):
        # No ``tree`` option: the mode is in the name (a replay's ``--tree`` leaves these be).
        self._C = load()
        self.history = history
        self.max_nodes, self.max_tree_depth = int(max_nodes), int(max_tree_depth)
        self.factor, self.offset, self.min_prob = max_spec_factor, max_spec_offset, min_token_prob
        self._local = None  # the request's tree, holding its first _local_len tokens
        self._local_len = 0
        self._local_head = self._local_tail = np.zeros(0, dtype=np.int64)
        self._global = self._C.SuffixTree(self.max_tree_depth)
        self._global_scope: str | None = None
        self._history_tokens = -1  # history.tokens(scope) when the global tree was synced
        self._seqs: dict[int, tuple[int, int]] = {}  # doc_id -> (seq id, tokens)
        self._next_seq = 0

    @property
    def memory_bytes(self) -> int:
        """The history index's arrays plus Arctic's two suffix trees (its own estimate)."""
        trees = self._global.estimate_memory() + (
            self._local.estimate_memory() if self._local is not None else 0)
        return super().memory_bytes + int(trees)

    def _sync_local(self, ctx: np.ndarray) -> None:
        # The same request grows: extend its tree by the new tokens. Checked on the held
        # prefix's first and last WINDOW tokens, not all of it: a full compare on every
        # call would make a long session quadratic (a wrong guess only costs draft quality).
        n = self._local_len
        w = min(n, WINDOW)
        if (self._local is None or len(ctx) < n
                or not np.array_equal(ctx[:w], self._local_head[:w])
                or not np.array_equal(ctx[n - w:n], self._local_tail[-w:] if w else ctx[:0])):
            self._local, n = self._C.SuffixTree(self.max_tree_depth), 0
        if len(ctx) > n:
            self._local.extend_ndarray(0, np.ascontiguousarray(ctx[n:], dtype=np.int32))
            self._local_len = len(ctx)
            self._local_head = np.array(ctx[:WINDOW])
            self._local_tail = np.array(ctx[-WINDOW:])
        else:
            self._local_len = n

    def _sync_global(self, scope: str | None) -> None:
        if self.history is None:
            return
        if scope is None:
            scopes = self.history.scopes()
            scope = scopes[0] if len(scopes) == 1 else None
        if scope != self._global_scope:  # another scope: a fresh global tree
            self._global, self._global_scope = self._C.SuffixTree(self.max_tree_depth), scope
            self._seqs, self._history_tokens = {}, -1
        if scope is None:
            return
        held = self.history.tokens(scope)
        if held == self._history_tokens:
            return
        docs = self.history.documents(scope)
        for doc_id in [d for d, (seq, n) in self._seqs.items()
                       if d not in docs or len(docs[d][1]) != n]:
            self._global.remove(self._seqs.pop(doc_id)[0])
        for doc_id, (_, toks) in docs.items():
            if doc_id not in self._seqs and len(toks):
                self._global.extend_ndarray(self._next_seq, np.ascontiguousarray(toks, np.int32))
                self._seqs[doc_id] = (self._next_seq, len(toks))
                self._next_seq = (self._next_seq + 1) & 0x7FFFFFFF
        self._history_tokens = held

    def propose(self, context: np.ndarray, k: int, *, scope: str | None = None,
                language: str | None = None) -> Draft | None:
        ctx = np.asarray(context)
        if k < 1 or len(ctx) < 2:
            return None
        self._sync_local(ctx)
        self._sync_global(scope)
        pattern = np.ascontiguousarray(ctx[-self.max_tree_depth:], dtype=np.int32)
        budget = self.max_nodes if self.use_tree_spec else min(self.max_nodes, k)
        args = (pattern, budget, self.factor, self.offset, self.min_prob, self.use_tree_spec)
        local = self._local.speculate_ndarray(*args)
        glob = self._global.speculate_ndarray(*args)
        if local.score >= glob.score:  # SuffixDecodingCache.speculate: the request's on ties
            return to_draft(local, k, "context")
        return to_draft(glob, k, "history")


@register
class ArcticPeer(_ArcticPeer):
    """Arctic Inference 0.3.0 SuffixDecoding, path mode (its default)."""

    name = "peer:arctic"


@register
class ArcticTreePeer(_ArcticPeer):
    """Arctic Inference 0.3.0 SuffixDecoding with ``use_tree_spec=True`` (token trees)."""

    name = "peer:arctic-tree"
    use_tree_spec = True
