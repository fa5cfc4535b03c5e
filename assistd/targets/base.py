"""The Target interface: the one model whose output is final.

A backend implements :meth:`Target._evaluate` (append tokens to the KV cache and
return logits for the requested rows) and :meth:`Target._truncate` (roll the KV
cache back). The base class keeps the list of tokens whose keys/values are in the
cache (``kv_tokens``), so the engine can reuse the longest common prefix of the
previous request (:meth:`Target.reuse_prefix`) on every backend alike.

A Target may keep several KV sequences (``n_seq_max``, each up to ``n_ctx`` tokens):
:meth:`Target.use_sequence` picks the one that ``evaluate``, ``truncate`` and
``reuse_prefix`` act on, so that several clients keep their prefixes warm. Which
client gets which sequence is the runtime's choice (``assistd.runtime.sequences``).

Token trees (docs/design.md, "Contracts the next pieces build on"): :class:`TokenTree`
holds a round's draft as a tree; :meth:`Target.evaluate_tree` evaluates every node in
one round (SpecInfer, Miao et al. 2024; Medusa's tree attention) and
:meth:`Target.keep_path` keeps the accepted root-to-node path in the cache. The base
class evaluates a tree as one chain per branch, sharing prefixes; backends override
the ``_evaluate_tree`` / ``_keep_path`` / ``_drop_tree`` hooks with one batch.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from assistd.ground.numerics import BATCH_PROMISE, DEFAULT_NUMERICS


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """``text`` with each lone surrogate as U+FFFD. A Python str holds one when it came
    from JSON's ``"\\ud800"`` (valid pairs are joined by then); no UTF-8 encoder takes it,
    so both backends' tokenizers see U+FFFD instead, as a transcript's text does.

    >>> encodable("a\\ud800b") == "a\\ufffdb"
    True
    """
    return _LONE_SURROGATE.sub("\ufffd", text)


def tokenizer_fingerprint(pieces: Iterable[bytes]) -> str:
    """sha256 over the token->id map: ``pieces[i]`` is the byte string of token id i.

    Two tokenizers share a fingerprint only if every id maps to the same piece,
    so token ids stored for one model are never read by another. Backends feed
    the UTF-8 of each token as the vocabulary spells it (llama.cpp's
    ``llama_vocab_get_text``: ``"Ġdef"``, not ``b" def"``), so that the llama and
    torch backends of one GGUF share a fingerprint and a history.
    """
    h = hashlib.sha256()
    for i, piece in enumerate(pieces):
        h.update(i.to_bytes(4, "little"))
        h.update(len(piece).to_bytes(4, "little"))
        h.update(piece)
    return h.hexdigest()[:32]


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences.

    >>> common_prefix_length([1, 2, 3, 4], [1, 2, 5]), common_prefix_length([], [1])
    (2, 0)
    """
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n


@dataclass(frozen=True)
class TokenTree:
    """A round's draft as a tree of tokens, nodes in topological order.

    ``tokens``: int ``[n]``; ``parents``: int ``[n]`` with ``parents[0] == -1`` and
    ``0 <= parents[i] < i`` otherwise; ``probs``: an optional estimate per node (the
    proposer's chance that the node is accepted), carried, never used by a Target.
    Node 0 is the root: the last committed token, whose logits predict the first
    draft tokens (the ``last`` of a chain round's ``[last] + draft``). ``depth[i]`` is
    the node's position offset: node i sits at position ``n_past + depth[i]``.
    Siblings must carry different tokens. Raises ValueError for a tree that breaks
    any of these rules.

    A Target keeps the accepted path's KV cheapest when it is a prefix ``0, 1, ..., j``
    of the node order, so put the likeliest branch first (depth-first, likeliest
    child first), as a chain is: ``TokenTree.chain([last, d1, d2])``.

    >>> t = TokenTree((7, 1, 2, 3), (-1, 0, 1, 0))
    >>> t.depth, t.children(0), t.leaves(), t.path_to(2)
    ((0, 1, 2, 1), [1, 3], [2, 3], [0, 1, 2])
    >>> TokenTree((7, 1, 1), (-1, 0, 0))
    Traceback (most recent call last):
    ...
    ValueError: nodes 1 and 2 are siblings with the same token 1
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    probs: tuple[float, ...] | None = None
    depth: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _children: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        tokens, parents = tuple(int(t) for t in self.tokens), tuple(int(p) for p in self.parents)
        if not tokens:
            raise ValueError("a token tree needs at least its root")
        if len(parents) != len(tokens):
            raise ValueError(f"{len(tokens)} tokens but {len(parents)} parents")
        if self.probs is not None and len(self.probs) != len(tokens):
            raise ValueError(f"{len(tokens)} tokens but {len(self.probs)} probs")
        if parents[0] != -1:
            raise ValueError(f"node 0 is the root: its parent must be -1, not {parents[0]}")
        if min(tokens) < 0:
            raise ValueError(f"token ids must be >= 0, got {min(tokens)}")
        depth, children = [0], [[] for _ in tokens]
        for i in range(1, len(tokens)):
            p = parents[i]
            if not 0 <= p < i:
                raise ValueError(f"node {i}: parent {p} is not an earlier node (0..{i - 1})")
            for c in children[p]:
                if tokens[c] == tokens[i]:
                    raise ValueError(f"nodes {c} and {i} are siblings with the same token {tokens[i]}")
            children[p].append(i)
            depth.append(depth[p] + 1)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "depth", tuple(depth))
        object.__setattr__(self, "_children", tuple(tuple(c) for c in children))

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> TokenTree:
        """The tree of one branch: ``[last] + draft`` as a chain round evaluates it."""
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self, i: int) -> list[int]:
        """Child nodes of node ``i``, in node order."""
        return list(self._children[i])

    def leaves(self) -> list[int]:
        """Nodes without children, in depth-first order (children in node order)."""
        out, stack = [], [0]
        while stack:
            i = stack.pop()
            if self._children[i]:
                stack.extend(reversed(self._children[i]))
            else:
                out.append(i)
        return out

    def path_to(self, i: int) -> list[int]:
        """Node indices from the root to node ``i``, both included."""
        path = [i]
        while self.parents[path[-1]] >= 0:
            path.append(self.parents[path[-1]])
        return path[::-1]

    def check_path(self, path: Sequence[int]) -> list[int]:
        """``path`` as a list of ints when it starts at the root and each node is the
        child of the one before; raises ValueError otherwise."""
        path = [int(i) for i in path]
        if not path or path[0] != 0:
            raise ValueError(f"a path starts at the root, node 0: {path}")
        for a, b in zip(path, path[1:]):
            if not 0 < b < len(self.tokens) or self.parents[b] != a:
                raise ValueError(f"node {b} is not a child of node {a} in path {path}")
        return path


class Target:
    """Base class for Target backends.

    Attributes set by a backend: ``model_path`` (str), ``n_ctx`` (tokens),
    ``n_vocab``, ``bos_token_id`` (int or None), ``add_bos`` (bool: the model
    expects a BOS at the start), ``eos_token_ids`` (frozenset: every end-of-generation
    id), ``fingerprint`` (see :func:`tokenizer_fingerprint`), ``device`` (str, e.g.
    ``"cpu"``, ``"cuda:0"``, ``"cpu+gpu:12 layers"``).
    """

    backend: ClassVar[str] = ""
    model_path: str
    n_ctx: int
    n_vocab: int
    bos_token_id: int | None
    add_bos: bool
    eos_token_ids: frozenset[int]
    fingerprint: str
    device: str = "cpu"
    # The kernels this Target runs: a mode of assistd.ground.numerics on llama.cpp,
    # "float" on torch (the same maths, rounded per kernel), "remote".
    numerics: str = DEFAULT_NUMERICS
    # What speculative greedy output promises (assistd.ground.numerics.PROMISES):
    # "exact" (one-token decoding's, bit for bit) or "batch-argmax"; None where
    # nothing is verified (a remote Target).
    promise: str | None = BATCH_PROMISE
    # Why speculation is off on this Target (None: it is on). The engine then decodes
    # plainly; status and the ledger JSON carry the reason.
    speculation_off: str | None = None

    # KV sequences kept (each holds up to n_ctx tokens), and the KV cache bytes one
    # token takes in one sequence (0: unknown), for status and the memory bound.
    n_seq_max: int = 1
    kv_bytes_per_token: int = 0

    @property
    def tree_leaves(self) -> int | None:
        """The most leaves a token tree may have and still cost one forward (None: no
        bound). 1 (this default): :meth:`evaluate_tree` evaluates a tree branch by
        branch, so only a chain costs what its tokens do, and the engine verifies a
        tree draft's first branch alone."""
        return 1

    def __init__(self) -> None:
        self._kv: list[list[int]] = [[]]  # per sequence: the tokens whose K/V are cached
        self.seq = 0  # the sequence evaluate/truncate/reuse_prefix act on
        self._tree: tuple[int, TokenTree, int] | None = None  # (seq, tree, n_past) until keep_path
        self._tree_cached: list[int] = []  # fallback: the tree nodes cached after evaluate_tree

    def _init_sequences(self, n: int) -> None:
        self.n_seq_max, self._kv, self.seq = n, [[] for _ in range(n)], 0

    @property
    def kv_tokens(self) -> list[int]:
        """Tokens in the current sequence's KV cache."""
        return self._kv[self.seq]

    def use_sequence(self, seq: int) -> None:
        """Make ``seq`` (0 .. n_seq_max-1) the sequence the next calls act on. Raises
        ValueError for a sequence this Target does not keep."""
        if not 0 <= seq < self.n_seq_max:
            raise ValueError(f"sequence {seq} is not in 0..{self.n_seq_max - 1}")
        self._settle_tree()
        self.seq = seq

    def sequence_tokens(self, seq: int) -> list[int]:
        """Tokens cached in sequence ``seq`` (a read-only view: do not modify)."""
        return self._kv[seq]

    def drop_sequence(self, seq: int) -> None:
        """Empty sequence ``seq``'s KV cache (an eviction); the current one stays current."""
        current = self.seq
        self.use_sequence(seq)
        try:
            self.truncate(0)
        finally:
            self.seq = current

    @property
    def n_past(self) -> int:
        """Tokens in the KV cache (positions ``0 .. n_past-1``)."""
        return len(self.kv_tokens)

    def evaluate(self, tokens: Sequence[int], logits_rows: Iterable[int]) -> np.ndarray:
        """Append ``tokens`` at positions ``n_past ..`` and return logits for the given rows.

        ``logits_rows`` index into ``tokens``. Returns float32 ``[len(rows), n_vocab]``
        (``[0, n_vocab]`` when no row is asked for), raw logits before any sampling
        transform. Raises ValueError when the tokens would run past ``n_ctx`` and
        RuntimeError when the backend fails; either way the cache is left as it was.
        """
        tokens = [int(t) for t in tokens]
        rows = list(logits_rows)
        self._settle_tree()
        if self.n_past + len(tokens) > self.n_ctx:
            raise ValueError(
                f"evaluating {len(tokens)} tokens at position {self.n_past} exceeds n_ctx={self.n_ctx}"
            )
        before = self.n_past
        try:
            out = self._evaluate(tokens, rows, before)
        except BaseException:
            self._truncate(before)  # a failed chunk must not leave half a batch behind
            raise
        self.kv_tokens.extend(tokens)
        return out

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions of the KV cache and drop the rest."""
        self._settle_tree()
        if n < self.n_past:
            self._truncate(n)
            del self.kv_tokens[n:]

    def reuse_prefix(self, tokens: Sequence[int]) -> int:
        """Keep the longest cached prefix of ``tokens``, drop the rest; return its length.

        The next :meth:`evaluate` then only needs ``tokens[result:]``. This is the
        prefix KV reuse across requests: a prefix cache hit, not draft acceptance
        (docs/design.md, "Vocabulary").
        """
        n = common_prefix_length(self.kv_tokens, tokens)
        self.truncate(n)
        return n

    # -- token trees -----------------------------------------------------------

    def evaluate_tree(self, tree: TokenTree) -> np.ndarray:
        """Append ``tree`` after the cached tokens and return logits for every node.

        Node i sits at position ``n_past + tree.depth[i]`` and attends to the cached
        tokens and to its own ancestors only (SpecInfer's tree attention, Miao et al.
        2024), so its row is the row a chain evaluation of ``tree.path_to(i)`` gives.
        Returns float32 ``[len(tree), n_vocab]``, raw logits. The tree stays pending
        until :meth:`keep_path`; ``kv_tokens`` and ``n_past`` do not change until
        then, and any other call on this Target (evaluate, truncate, use_sequence,
        another tree) drops it first. Raises ValueError for a token id outside the
        vocabulary or when the tree's nodes would run past ``n_ctx`` (``n_past +
        len(tree)`` cells; ``TokenTree`` itself refuses a malformed tree), and
        RuntimeError when the backend fails; either way the cache is left as it was.
        """
        self._settle_tree()
        if max(tree.tokens) >= self.n_vocab:
            raise ValueError(f"token id {max(tree.tokens)} is outside the vocabulary "
                             f"(n_vocab={self.n_vocab})")
        before = self.n_past
        if before + len(tree) > self.n_ctx:
            raise ValueError(f"a tree of {len(tree)} nodes at position {before} exceeds n_ctx={self.n_ctx}")
        try:
            out = self._evaluate_tree(tree, before)
        except BaseException:
            self._drop_tree(tree, before)
            raise
        self._tree = (self.seq, tree, before)
        return out

    def keep_path(self, path: Sequence[int]) -> None:
        """Keep the pending tree's root-to-node ``path`` (node indices, root included)
        as the sequence's continuation and drop every other node: ``kv_tokens`` then
        ends with ``[tree.tokens[i] for i in path]``, as if that chain had been
        evaluated. Raises RuntimeError when no tree is pending and ValueError for a
        path that is not one (the tree then stays pending); on a backend failure
        (RuntimeError) the whole tree is dropped, leaving the cache as it was before
        :meth:`evaluate_tree`.
        """
        if self._tree is None or self._tree[0] != self.seq:
            raise RuntimeError("keep_path needs a tree from evaluate_tree on this sequence")
        _, tree, before = self._tree
        path = tree.check_path(path)
        self._tree = None
        try:
            self._keep_path(tree, path, before)
        except BaseException:
            self._drop_tree(tree, before)
            raise
        self.kv_tokens.extend(tree.tokens[i] for i in path)

    def _settle_tree(self) -> None:
        """Drop a tree still pending (no keep_path came), in the sequence it was evaluated in."""
        if self._tree is not None:
            seq, tree, before = self._tree
            self._tree = None
            current, self.seq = self.seq, seq
            try:
                self._drop_tree(tree, before)
            finally:
                self.seq = current

    def _evaluate_tree(self, tree: TokenTree, n_past: int) -> np.ndarray:
        """Fallback for every backend: each branch as a chain, depth first, sharing the
        prefix already cached (truncate to the fork, evaluate the rest), so each node
        is evaluated once and exactly as a chain evaluates it. Leaves the last
        branch's nodes cached (``self._tree_cached``)."""
        out = np.empty((len(tree), self.n_vocab), dtype=np.float32)
        cached = self._tree_cached = []
        for leaf in tree.leaves():
            branch = tree.path_to(leaf)
            keep = common_prefix_length(cached, branch)
            if keep < len(cached):
                self._truncate(n_past + keep)
                del cached[keep:]
            new = branch[keep:]
            out[new] = self._evaluate([tree.tokens[i] for i in new], list(range(len(new))), n_past + keep)
            cached.extend(new)
        return out

    def _keep_path(self, tree: TokenTree, path: list[int], n_past: int) -> None:
        """Fallback: keep what the last branch shares with ``path``, evaluate the rest."""
        cached = self._tree_cached
        keep = common_prefix_length(cached, path)
        self._truncate(n_past + keep)
        rest = [tree.tokens[i] for i in path[keep:]]
        if rest:
            self._evaluate(rest, [], n_past + keep)

    def _drop_tree(self, tree: TokenTree, n_past: int) -> None:
        """Return the cache to the ``n_past`` tokens it held before the tree."""
        self._truncate(n_past)

    # -- backend hooks -------------------------------------------------------

    def _evaluate(self, tokens: list[int], rows: list[int], n_past: int) -> np.ndarray:
        raise NotImplementedError

    def _truncate(self, n: int) -> None:
        raise NotImplementedError

    # -- tokenizer -----------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """Text -> token ids, no BOS, special-token text treated as plain text."""
        raise NotImplementedError

    def detokenize(self, ids: Sequence[int], prev: Sequence[int] | None = None) -> str:
        """Token ids -> text; ``prev`` (the tokens before them) lets a tokenizer place spaces."""
        raise NotImplementedError

    def pieces(self) -> list[bytes]:
        """The token->id map: ``pieces()[i]`` is token id i as the vocabulary spells it.

        These are the byte strings :func:`tokenizer_fingerprint` hashes; a draft
        model's compatibility check (``assistd.targets.compat``) compares them id by id.
        """
        raise NotImplementedError

    def special_ids(self) -> frozenset[int]:
        """Ids of the control (special) tokens: BOS, EOS, chat-turn markers..."""
        raise NotImplementedError

    def control_spellings(self, text: str = "") -> dict[str, int]:
        """Control tokens by spelling, ``{"<|im_start|>": 1, ...}``: the texts a chat
        template writes for them (spellings of one character are left out: they would
        match ordinary text). The Target's own table, which only grows: callers may
        cache on its length. Base: every control token of the vocabulary
        (:meth:`special_ids` spelled by :meth:`pieces`), built once. ``text``: where the
        caller will look for them, for a Target that learns its control tokens as it
        meets them (the remote Target without a local tokenizer asks its server about
        the spellings in it first)."""
        table = getattr(self, "_control_table", None)
        if table is None:
            pieces, table = self.pieces(), {}
            for i in sorted(self.special_ids()):
                spelling = pieces[i].decode("utf-8", errors="replace")
                if len(spelling) > 1 and spelling not in table:
                    table[spelling] = i
            self._control_table = table
        return table

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """Fill-in-the-middle ids ``(prefix, suffix, middle)`` when the model declares
        them (GGUF ``tokenizer.ggml.fim_*_token_id``, or the names llama.cpp's vocab
        loader recognises); None means prefix-only prompting. Base: None."""
        return None

    def chat_template(self) -> str | None:
        """The model's Jinja chat template (GGUF ``tokenizer.chat_template``, or the
        Hugging Face tokenizer's), or None when it declares none. Base: read from
        the model file when it is a GGUF."""
        from pathlib import Path

        from assistd.targets.gguf_header import gguf_metadata

        path = Path(self.model_path)
        if not path.is_file():
            return None
        try:
            return gguf_metadata(path, {"tokenizer.chat_template"}).get("tokenizer.chat_template")
        except Exception:  # noqa: BLE001 - not a GGUF, or unreadable: no template
            return None

    def close(self) -> None:
        """Release the model and its buffers."""


# Memory the KV sequences of one Target may reserve when their number is "auto".
KV_BUDGET_BYTES = 512 * 2**20
AUTO_SEQUENCES_MAX = 4


def choose_sequences(requested: int | str | None, kv_bytes_per_token: int, n_ctx: int) -> int:
    """How many KV sequences to keep: ``requested`` when it is a number (>= 1), else as
    many full-context sequences as fit in ``KV_BUDGET_BYTES`` (at least 1, at most
    ``AUTO_SEQUENCES_MAX``; the maximum when the per-token size is unknown).

    >>> choose_sequences("auto", 23_040, 2048), choose_sequences("auto", 524_288, 4096), choose_sequences(2, 1, 1)
    (4, 1, 2)
    """
    if requested not in (None, "auto"):
        n = int(requested)
        if n < 1:
            raise ValueError(f"sequences must be at least 1, not {requested!r}")
        return n
    if kv_bytes_per_token <= 0:
        return AUTO_SEQUENCES_MAX
    return max(1, min(AUTO_SEQUENCES_MAX, KV_BUDGET_BYTES // (kv_bytes_per_token * n_ctx)))
