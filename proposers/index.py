"""The history index: every token of a scope's history, searchable by context suffix.

Per scope, a few immutable *segments* and one small *tail*:

- A segment holds documents' tokens, each document followed by a separator,
  concatenated and **reversed**, stored as big-endian fixed-width bytes (2 bytes a
  token when the vocabulary has fewer than 65,535 ids, else 4) with a suffix array
  over the token-aligned suffixes (libdivsufsort through ``pydivsufsort``). Reversed,
  the longest suffix of the context that occurs in the history is the longest
  *prefix* of the reversed context, which libdivsufsort's ``sa_search`` finds as one
  suffix-array range; what followed each occurrence is read backwards from it.
  Memory: 2 + 4 = 6 bytes per token (width 2), plus a few per document.
- The tail collects small recent documents and is rebuilt (milliseconds) on the
  first lookup after a change; past ``tail_tokens`` it is sealed into a segment, and
  when a scope has more than ``max_segments`` segments the smallest are merged.

A replaced document is tombstoned (its occurrences are skipped) and its segment is
rebuilt once a quarter of it is dead; :meth:`HistoryIndex.remove` (forgetting)
rebuilds the segment at once, so forgotten tokens leave memory immediately. Memory
is bounded by ``max_tokens`` across scopes: the least recently used scopes are
dropped whole (they reload from SQLite on their next use).

Lookup cost: a binary search over the match length (~7 ``sa_search`` calls per
segment, each O(m log N) in C), then a vectorised gather of at most
``max_occurrences`` continuations; no Python loop over history tokens.
"""

from __future__ import annotations

import ctypes
import math
import os
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from pydivsufsort import divsufsort
from pydivsufsort.dll import libdivsufsort

SEP = -1  # in continuation rows: the document ended here (never a token id)
MAX_DEPTH = 64  # longest context suffix matched, in tokens (SuffixDecoding's tree depth)
LOAD_SEGMENT_TOKENS = 4_000_000  # least segment size when loading a scope

_sa_search = libdivsufsort.sa_search
_sa_search.restype = ctypes.c_int32
_sa_search.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int32,
                       ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]


@dataclass
class Occurrences:
    """Where the longest matching context suffix occurs, and what followed it.

    match_len: tokens of context suffix matched (0: nothing matched).
    count:     occurrences in the history (before sampling).
    cont:      int64 ``[c, depth]``: the tokens after each (sampled) occurrence,
               ``SEP`` from the end of its document on.
    recency:   int64 ``[c]``: larger = more recently added document / later in it.
    sources:   ``(first row, names, doc index per row)`` blocks, one per segment, from
               which :meth:`name` resolves a row's document (names are resolved only
               for the row a draft is read from: resolving all would cost a Python loop).
    """

    match_len: int
    count: int
    cont: np.ndarray
    recency: np.ndarray
    sources: list = field(default_factory=list)

    def name(self, row: int) -> str | None:
        """The name of the document row ``row`` was read from (None for the live context)."""
        for first, names, doc_index in reversed(self.sources):
            if row >= first:
                return names[int(doc_index[row - first])]
        return None

    @classmethod
    def empty(cls, depth: int) -> Occurrences:
        return cls(0, 0, np.zeros((0, depth), dtype=np.int64), np.zeros(0, dtype=np.int64))


class Segment:
    """Immutable: documents reversed and concatenated, with a suffix array.

    docs: ``(doc_id, seq, name, tokens int [n])``. ``seq`` orders documents by when they
    were added (recency). Raises ValueError on a token id that does not fit ``width``.
    """

    def __init__(self, docs: list[tuple[int, int, str, np.ndarray]], width: int):
        self.width = width
        self.sep = (1 << (8 * width)) - 1
        self.doc_ids = np.array([d[0] for d in docs], dtype=np.int64)
        self.doc_seq = np.array([d[1] for d in docs], dtype=np.int64)
        self.names = [d[2] for d in docs]
        lens = np.array([len(d[3]) for d in docs], dtype=np.int64)
        self.doc_lens = lens
        # Forward layout T = d1 SEP d2 SEP ... dn SEP; doc_starts in T coordinates.
        self.doc_starts = np.concatenate([[0], np.cumsum(lens + 1)[:-1]]).astype(np.int64)
        n = int((lens + 1).sum())
        fwd = np.full(n, self.sep, dtype=f">u{width}")
        for start, (_, _, _, toks) in zip(self.doc_starts, docs):
            toks = np.asarray(toks)
            if len(toks) and (toks.min() < 0 or toks.max() >= self.sep):
                raise ValueError(f"token ids must be in [0, {self.sep}) for width {width}")
            fwd[start : start + len(toks)] = toks
        self.n = n
        self.rev = np.ascontiguousarray(fwd[::-1])  # R[i] = T[n - 1 - i]
        self.bytes_ = self.rev.view(np.uint8)
        sa = divsufsort(self.bytes_) if n else np.zeros(0, dtype=np.int32)
        self.sa = np.ascontiguousarray(sa[sa % width == 0], dtype=np.int32)  # byte offsets
        self.alive = np.ones(len(docs), dtype=bool)
        self.dead_tokens = 0
        self._text_p = self.bytes_.ctypes.data
        self._sa_p = self.sa.ctypes.data
        self._n_bytes, self._n_sa = len(self.bytes_), len(self.sa)
        self._left = ctypes.c_int32()  # out-parameter of sa_search (not thread-safe)
        self._left_ref = ctypes.byref(self._left)

    @property
    def tokens(self) -> int:
        return int(self.doc_lens.sum())

    @property
    def nbytes(self) -> int:
        return int(self.rev.nbytes + self.sa.nbytes + 40 * len(self.doc_ids))

    def count(self, pattern: bytes) -> tuple[int, int]:
        """``(occurrences, first SA index)`` of a reversed, encoded token pattern."""
        c = _sa_search(self._text_p, self._n_bytes, pattern, len(pattern),
                       self._sa_p, self._n_sa, self._left_ref)
        return c, self._left.value

    def doc_index(self, rev_pos: np.ndarray) -> np.ndarray:
        """Document index of each reversed-token position (int64 ``[c]``)."""
        return np.searchsorted(self.doc_starts, self.n - 1 - rev_pos, "right") - 1

    def has_alive(self, left: int, count: int) -> bool:
        """Whether the SA range holds an occurrence in a live document."""
        if not self.dead_tokens:
            return count > 0
        probe = self.sa[left : left + min(count, 256)] // self.width
        if self.alive[self.doc_index(probe)].any():
            return True
        if count <= 256:
            return False
        rest = self.sa[left + 256 : left + count] // self.width
        return bool(self.alive[self.doc_index(rest)].any())

    def occurrences(self, left: int, count: int, limit: int) -> np.ndarray:
        """Reversed-token positions of up to ``limit`` live occurrences of an SA range,
        evenly strided over the range when it holds more."""
        if self.dead_tokens:
            pos = self.sa[left : left + count] // self.width
            pos = pos[self.alive[self.doc_index(pos)]]
            if len(pos) > limit:
                pos = pos[(np.arange(limit) * len(pos)) // limit]
        elif count > limit:  # sample first: a range can hold millions of occurrences
            pos = self.sa[left + (np.arange(limit) * count) // limit] // self.width
        else:
            pos = self.sa[left : left + count] // self.width
        return pos.astype(np.int64)

    def continuations(self, pos: np.ndarray, depth: int) -> np.ndarray:
        """int64 ``[c, depth]``: the tokens after each occurrence, SEP from its document's end."""
        idx = pos[:, None] - 1 - np.arange(depth)[None, :]
        cont = self.rev[np.maximum(idx, 0)].astype(np.int64)
        cont[idx < 0] = self.sep
        ended = np.cumsum(cont == self.sep, axis=1) > 0
        cont[ended] = SEP
        return cont

    def live_docs(self) -> list[tuple[int, int, str, np.ndarray]]:
        """The live documents with their tokens (for a rebuild)."""
        out = []
        for i in np.flatnonzero(self.alive):
            s, n = int(self.doc_starts[i]), int(self.doc_lens[i])
            fwd = self.rev[self.n - s - n : self.n - s][::-1]
            out.append((int(self.doc_ids[i]), int(self.doc_seq[i]), self.names[i],
                        fwd.astype(np.int64)))
        return out

    def kill(self, doc_id: int) -> None:
        i = int(np.flatnonzero(self.doc_ids == doc_id)[0])
        if self.alive[i]:
            self.alive[i] = False
            self.dead_tokens += int(self.doc_lens[i])


class _Scope:
    def __init__(self):
        self.segments: list[Segment] = []
        self.tail: dict[int, tuple[int, str, np.ndarray]] = {}  # doc_id -> (seq, name, tokens)
        self.tail_count = 0  # tokens in the tail
        self.tail_segment: Segment | None = None
        self.tail_dirty = False
        self.where: dict[int, Segment | None] = {}  # doc_id -> its segment, None = the tail
        self.last_used = time.monotonic()
        self.version = 0  # bumped by every change of the scope's contents
        self.last_match = None  # (version, max_depth, context length, match length, tail)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.segments) + self.tail_count

    @property
    def nbytes(self) -> int:
        tail = self.tail_segment.nbytes if self.tail_segment is not None else 0
        return sum(s.nbytes for s in self.segments) + tail + sum(
            t[2].nbytes for t in self.tail.values())


class HistoryIndex:
    """The in-memory index over the persistent history, per scope. Not thread-safe:
    one thread (the decode loop's) uses it at a time.

    max_tokens:      bound on history tokens held across scopes (least recently used
                     scopes are dropped past it; 64 M tokens ~ 400 MB).
    tail_tokens:     size at which the tail is sealed into a segment.
    max_segments:    segments per scope before the smallest are merged.
    max_occurrences: occurrences sampled per lookup (bounds a lookup's cost).
    width:           bytes per token: 2 for vocabularies under 65,535 ids, else 4.

    Document ids are global (the store's ``documents.id``); a document belongs to one scope.
    """

    def __init__(self, *, max_tokens: int = 64_000_000, tail_tokens: int = 131_072,
                 max_segments: int = 8, max_occurrences: int = 256, width: int = 2):
        if width not in (2, 4):
            raise ValueError("width must be 2 or 4 bytes per token")
        self.max_tokens, self.tail_tokens = max_tokens, tail_tokens
        self.max_segments, self.max_occurrences, self.width = max_segments, max_occurrences, width
        self._scopes: OrderedDict[str, _Scope] = OrderedDict()
        self._scope_of: dict[int, str] = {}
        self._seq = 0
        self.store_seq = 0  # last change of the store applied (see :meth:`sync`)
        # scope -> (tokenizer fingerprint it was loaded for, store change seq at load)
        self._loaded: dict[str, tuple[str, int]] = {}
        self.evictions = 0

    # -- contents ------------------------------------------------------------

    def put(self, scope: str, doc_id: int, tokens, name: str = "") -> None:
        """Add or replace document ``doc_id`` (token ids ``[n]``) in ``scope``."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if doc_id in self._scope_of:
            self._drop(doc_id, compact_now=False)
        sc = self._scopes.get(scope)
        if sc is None:
            sc = self._scopes[scope] = _Scope()
        sc.version += 1
        self._seq += 1
        self._scope_of[doc_id] = scope
        if len(tokens) >= self.tail_tokens:
            seg = Segment([(doc_id, self._seq, name, tokens)], self.width)
            sc.segments.append(seg)
            sc.where[doc_id] = seg
            self._merge_small(sc)
        else:
            sc.tail[doc_id] = (self._seq, name, tokens)
            sc.tail_count += len(tokens)
            sc.where[doc_id] = None
            sc.tail_dirty = True
            if sc.tail_count >= self.tail_tokens:
                self._seal(sc)
        self._enforce_budget(keep=scope)

    def remove(self, doc_id: int) -> bool:
        """Forget a document: its tokens leave every structure now. False if unknown."""
        if doc_id not in self._scope_of:
            return False
        self._drop(doc_id, compact_now=True)
        return True

    def has(self, doc_id: int) -> bool:
        """Whether document ``doc_id`` is held (a reload of its scope drops in-memory ones)."""
        return doc_id in self._scope_of

    def drop_scope(self, scope: str) -> None:
        sc = self._scopes.pop(scope, None)
        self._loaded.pop(scope, None)
        if sc is not None:
            for d in sc.where:
                self._scope_of.pop(d, None)

    def scopes(self) -> list[str]:
        return list(self._scopes)

    def documents(self, scope: str) -> dict[int, tuple[str, np.ndarray]]:
        """The live documents of a scope: ``{doc_id: (name, tokens)}`` (for checks)."""
        sc = self._scopes.get(scope)
        if sc is None:
            return {}
        out = {d: (name, toks) for d, (_, name, toks) in sc.tail.items()}
        for seg in sc.segments:
            for d, _, name, toks in seg.live_docs():
                out[d] = (name, toks)
        return out

    def tokens(self, scope: str | None = None) -> int:
        """History tokens held (live and tombstoned), in one scope or all."""
        if scope is not None:
            sc = self._scopes.get(scope)
            return sc.tokens if sc else 0
        return sum(sc.tokens for sc in self._scopes.values())

    @property
    def nbytes(self) -> int:
        """Bytes of RAM held by the index's arrays."""
        return sum(sc.nbytes for sc in self._scopes.values())

    # -- lookup --------------------------------------------------------------

    def find(self, scope: str | None, context: np.ndarray, depth: int,
             max_depth: int = MAX_DEPTH, min_len: int = 1,
             alpha: float | None = None) -> Occurrences:
        """The longest suffix of ``context`` (at least ``min_len``, at most ``max_depth``
        tokens) found in the scope's history, with the ``depth`` tokens that followed
        each occurrence (at most ``max_occurrences`` rows, evenly sampled). With
        ``alpha``, only ``floor(alpha * match length)`` tokens are read after each
        occurrence (what a draft capped at alpha times the match can use).

        ``scope=None`` searches the only scope there is (none if several).
        """
        sc = self._scope_for(scope)
        if sc is None or depth < 1 or len(context) < min_len:
            return Occurrences.empty(max(depth, 0))
        sc.last_used = time.monotonic()
        segs = self._searchable(sc)
        tail = np.asarray(context[-max_depth:])
        bad = np.flatnonzero((tail < 0) | (tail >= (1 << (8 * self.width)) - 1))
        if len(bad):  # not a token id of this width: match only what follows it
            tail = tail[bad[-1] + 1 :]
            if len(tail) < min_len:
                return Occurrences.empty(depth)
        pattern = tail[::-1].astype(f">u{self.width}").tobytes()
        w = self.width
        bound = self._match_bound(sc, context, max_depth, len(tail))
        best, hits = 0, []  # hits: (segment, count, left) holding the best length
        if bound:  # decoding usually extends the last match: try its upper bound first
            for seg in segs:
                c, left = seg.count(pattern[: bound * w])
                if c and seg.has_alive(left, c):
                    hits.append((seg, c, left))
            if hits:
                best = bound
        top = bound - 1 if bound else len(tail)  # no match is longer than this now
        # The biggest segment first: it most likely holds the longest match, so the
        # others mostly need one or two probes at and just above that length.
        for seg in (sorted(segs, key=lambda s: -s.n) if not best else ()):
            lo, at_lo = 0, (0, 0)
            if best:
                at_lo = seg.count(pattern[: best * w])
                if not seg.has_alive(at_lo[1], at_lo[0]):
                    continue
                lo = best
                if lo < top:
                    c, left = seg.count(pattern[: (lo + 1) * w])
                    if not (c and seg.has_alive(left, c)):
                        hits.append((seg, *at_lo))
                        continue
                    lo, at_lo = lo + 1, (c, left)
            hi = top
            while lo < hi:  # invariant: length lo matches (0 trivially), hi+1.. do not
                mid = (lo + hi + 1) // 2
                c, left = seg.count(pattern[: mid * w])
                if c and seg.has_alive(left, c):
                    lo, at_lo = mid, (c, left)
                else:
                    hi = mid - 1
            if lo > best:
                best, hits = lo, []
            if lo == best and lo > 0:
                hits.append((seg, *at_lo))
        sc.last_match = (sc.version, max_depth, len(context), best,
                         np.array(context[-MAX_DEPTH:], dtype=np.int64))
        if best < min_len:
            return Occurrences.empty(depth)
        if alpha is not None:
            depth = max(1, min(depth, math.floor(alpha * best + 1e-6)))
        return self._gather(hits, best, depth)

    def find_at(self, scope: str | None, context: np.ndarray, m: int, depth: int) -> Occurrences:
        """The occurrences of exactly the last ``m`` tokens of ``context`` (``m`` <= 64) and
        what followed them, as :meth:`find` returns them; empty if there are none."""
        sc = self._scope_for(scope)
        if sc is None or depth < 1 or m < 1 or len(context) < m:
            return Occurrences.empty(max(depth, 0))
        tail = np.asarray(context[-m:])
        if tail.min() < 0 or tail.max() >= (1 << (8 * self.width)) - 1:
            return Occurrences.empty(depth)
        pattern = tail[::-1].astype(f">u{self.width}").tobytes()
        hits = []
        for seg in self._searchable(sc):
            c, left = seg.count(pattern)
            if c and seg.has_alive(left, c):
                hits.append((seg, c, left))
        return self._gather(hits, m, depth) if hits else Occurrences.empty(depth)

    def _searchable(self, sc: _Scope) -> list[Segment]:
        """The scope's segments, the tail rebuilt first if it changed."""
        if sc.tail_dirty:
            self._rebuild_tail(sc)
        return sc.segments + ([sc.tail_segment] if sc.tail_segment is not None else [])

    def _gather(self, ranges, m: int, depth: int) -> Occurrences:
        """Rows of continuations for SA ranges ``(segment, count, left)`` of one match."""
        total = sum(c for _, c, _ in ranges)
        conts, recs, sources, rows = [], [], [], 0
        for seg, c, left in ranges:
            limit = max(1, (self.max_occurrences * c) // total) if total > self.max_occurrences else c
            pos = seg.occurrences(left, c, limit)
            if not len(pos):
                continue
            di = seg.doc_index(pos)
            offset = (seg.n - 1 - pos) - seg.doc_starts[di]
            conts.append(seg.continuations(pos, depth))
            recs.append(seg.doc_seq[di] * (1 << 32) + offset)
            sources.append((rows, seg.names, di))
            rows += len(pos)
        if not conts:
            return Occurrences.empty(depth)
        return Occurrences(m, total, np.concatenate(conts), np.concatenate(recs), sources)

    @staticmethod
    def _match_bound(sc: _Scope, context: np.ndarray, max_depth: int, longest: int) -> int:
        """An upper bound on the match length from the previous lookup (0: none).

        If the previous context (L0 tokens, longest match m0) is a prefix of this one
        (L tokens) and the scope has not changed since, a suffix of length m found now
        contains a suffix of the old context of length m - (L - L0), so
        m <= m0 + (L - L0).
        """
        if sc.last_match is None:
            return 0
        version, depth0, n0, m0, tail0 = sc.last_match
        grown = len(context) - n0
        if version != sc.version or depth0 != max_depth or grown < 0 or n0 < len(tail0):
            return 0
        if not np.array_equal(context[n0 - len(tail0) : n0], tail0):
            return 0
        return min(longest, m0 + grown)

    # -- persistence: load from and follow the SQLite history ---------------------

    def load(self, store, scope: str, fingerprint: str) -> int:
        """(Re)build ``scope`` from the store's documents tokenized by ``fingerprint``.

        Returns the tokens loaded. Newest documents first when the scope alone is over
        ``max_tokens``. Remembers the store's change sequence, so :meth:`sync` applies
        only what changed after it.
        """
        seq = store.last_change_seq()
        self.drop_scope(scope)
        counts = store.token_counts(scope, fingerprint)
        # Newest documents first when the scope alone is over the budget.
        budget, min_id = self.max_tokens, 0
        for doc_id, n in reversed(counts):
            if n > budget:
                min_id = doc_id + 1
                break
            budget -= n
        total = sum(n for d, n in counts if d >= min_id)
        sc = self._scopes[scope] = _Scope()
        # Few segments make lookups cheap (each costs a probe or two); one per core
        # builds in parallel (libdivsufsort runs in C without the GIL, through ctypes).
        workers = os.cpu_count() or 1
        seg_tokens = max(LOAD_SEGMENT_TOKENS, -(-total // workers))
        futures, batch, batch_tokens = [], [], 0
        with ThreadPoolExecutor(workers) as pool:
            for doc_id, path, ids in store.iter_token_arrays(scope, fingerprint, min_id):
                self._seq += 1
                self._scope_of[doc_id] = scope
                batch.append((doc_id, self._seq, path, ids))
                batch_tokens += len(ids)
                if batch_tokens >= seg_tokens:
                    futures.append(pool.submit(Segment, batch, self.width))
                    batch, batch_tokens = [], 0
            if batch:
                futures.append(pool.submit(Segment, batch, self.width))
            for fut in futures:
                seg = fut.result()
                sc.segments.append(seg)
                for d in seg.doc_ids.tolist():
                    sc.where[d] = seg
        self._loaded[scope] = (fingerprint, seq)
        if not self.store_seq:
            self.store_seq = seq
        self._enforce_budget(keep=scope)
        return sc.tokens

    def ensure(self, store, scope: str, fingerprint: str) -> None:
        """Load ``scope`` if it is not loaded for this tokenizer, then apply new changes."""
        if self._loaded.get(scope, ("",))[0] != fingerprint:
            self.load(store, scope, fingerprint)
        self.sync(store)

    def sync(self, store) -> int:
        """Apply the store's changes since the last one applied, for loaded scopes.

        ``put`` re-reads the document's tokens, ``delete`` forgets it. If the store
        pruned changes this index never saw, the loaded scopes are rebuilt. Returns
        the number of changes applied.
        """
        if not self._loaded:
            self.store_seq = store.last_change_seq()
            return 0
        rows = store.changes_since(self.store_seq)
        if not rows:
            return 0
        first = store.first_change_seq()
        if first is not None and first > self.store_seq + 1:
            # Changes this index never saw were pruned: rebuild what is loaded.
            for scope, (fp, _) in list(self._loaded.items()):
                self.load(store, scope, fp)
            self.store_seq = rows[-1][0]
            return len(rows)
        latest: dict[int, tuple[int, str, str]] = {}
        for seq, doc_id, scope, op in rows:
            latest[doc_id] = (seq, scope, op)  # only the last op of a document matters
        for doc_id, (seq, scope, op) in latest.items():
            fp, loaded_at = self._loaded.get(scope, (None, 0))
            if fp is None or seq <= loaded_at:
                continue  # not loaded, or already in what load() read
            got = store.document_tokens(doc_id, fp) if op == "put" else None
            if got is None:
                self.remove(doc_id)
            else:
                self.put(scope, doc_id, got[1], got[0])
        self.store_seq = rows[-1][0]
        return len(rows)

    # -- internals -------------------------------------------------------------

    def _scope_for(self, scope: str | None) -> _Scope | None:
        if scope is None:
            return next(iter(self._scopes.values())) if len(self._scopes) == 1 else None
        sc = self._scopes.get(scope)
        if sc is not None:
            self._scopes.move_to_end(scope)
        return sc

    def _drop(self, doc_id: int, compact_now: bool) -> None:
        scope = self._scope_of.pop(doc_id)
        sc = self._scopes[scope]
        sc.version += 1
        seg = sc.where.pop(doc_id)
        if seg is None:
            sc.tail_count -= len(sc.tail.pop(doc_id)[2])
            sc.tail_dirty = True
            if compact_now:  # forgetting: the old tail arrays must not outlive this call
                self._rebuild_tail(sc)
            return
        seg.kill(doc_id)
        if compact_now or seg.dead_tokens * 4 > seg.tokens:
            self._rebuild(sc, seg)

    def _add_segment(self, sc: _Scope, docs) -> Segment | None:
        if not docs:
            return None
        seg = Segment(docs, self.width)
        sc.segments.append(seg)
        for d in docs:
            sc.where[d[0]] = seg
        return seg

    def _rebuild(self, sc: _Scope, seg: Segment) -> None:
        sc.segments.remove(seg)
        self._add_segment(sc, seg.live_docs())

    def _rebuild_tail(self, sc: _Scope) -> None:
        docs = [(d, seq, name, toks) for d, (seq, name, toks) in sc.tail.items()]
        sc.tail_segment = Segment(docs, self.width) if docs else None
        sc.tail_dirty = False

    def _seal(self, sc: _Scope) -> None:
        docs = [(d, seq, name, toks) for d, (seq, name, toks) in sc.tail.items()]
        sc.tail.clear()
        sc.tail_count = 0
        sc.tail_segment, sc.tail_dirty = None, False
        self._add_segment(sc, docs)
        self._merge_small(sc)

    def _merge_small(self, sc: _Scope) -> None:
        while len(sc.segments) > self.max_segments:
            a, b = sorted(sc.segments, key=lambda s: s.tokens)[:2]
            sc.segments.remove(a)
            sc.segments.remove(b)
            self._add_segment(sc, a.live_docs() + b.live_docs())

    def _enforce_budget(self, keep: str) -> None:
        while self.tokens() > self.max_tokens and len(self._scopes) > 1:
            victim = min((s for s in self._scopes if s != keep),
                         key=lambda s: self._scopes[s].last_used)
            self.drop_scope(victim)
            self.evictions += 1
