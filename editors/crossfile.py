"""Cross-file context: snippets of the other open buffers of a document's scope, placed
in the prompt before the document's window (docs/design.md, "Editors").

The sources are the scope's open buffers (never the document itself, never another
scope's) that the history would keep (:func:`kept`: the path rules of
:class:`storage.walk.IgnoreRules`, which refuse credential files such as ``.env`` and
``*.key``, ignored files and folders and ``.git/``; and no binary text), the most
recently changed or saved first. Each is cut into chunks of
``CHUNK_LINES`` lines every ``CHUNK_STRIDE`` lines, after the history's secret filter
(:func:`storage.secrets.redact`): a snippet is never less redacted than the history.
The chunks most similar to the lines around the cursor (Jaccard similarity of their
identifier sets, as Continue ranks its snippets) fill the token budget, the most similar
last (nearest the document), each headed by its path in a comment of its language, and
the document's own path after them.

The choice is kept per document while the cursor stays within ``REGION_LINES`` lines of
where it was made, the scope's set of open buffers is the same, and no chosen chunk's
source changed much: its tokens are then the same prefix of every prompt, so the
Target's KV cache keeps them and typing still only appends (llama.vim keeps its ring of
chunks warm on the server the same way).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from storage.indexer import is_binary
from storage.secrets import redact
from storage.walk import IgnoreRules

CHUNK_LINES = 16  # lines per chunk
CHUNK_STRIDE = 8  # a chunk starts every this many lines (chunks overlap by half)
CHUNK_MAX_CHARS = 3000  # a longer chunk (minified lines) is never chosen
QUERY_LINES = (20, 10)  # lines before and after the cursor it is compared with
REGION_LINES = 24  # the cursor moving farther than this from the choice re-chooses
MIN_SIMILARITY = 0.1  # a chunk less similar to the cursor's lines is noise, not context
KEEP_SIMILARITY = 0.5  # a changed source keeps its chosen chunk if its new text is this close
MAX_SOURCES = 16  # the most recently changed open buffers that are read
MAX_CHUNKS = 8  # chunks in the prompt at most
BINARY_SNIFF_CHARS = 8192  # a NUL in the first this many characters: binary, as git decides

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
# Words in nearly every chunk of their language: they make any two chunks look alike.
_STOP = frozenset(
    "and def elif else for from import None not pass return self True False while with class"
    " const let var function this new null true false undefined void int".split())
# Line comments by file suffix (or name); anything else gets "//".
_COMMENT = {
    **dict.fromkeys(".py .pyi .sh .bash .zsh .fish .rb .pl .r .jl .ex .exs .nim .tf .yaml"
                    " .yml .toml .cfg .ini .conf .cmake .ps1 .mk makefile dockerfile"
                    " .gitignore .txt".split(), ("#", "")),
    **dict.fromkeys(".lua .sql .hs .elm .ada".split(), ("--", "")),
    **dict.fromkeys(".el .clj .cljs .scm .lisp".split(), (";;", "")),
    **dict.fromkeys(".tex .erl .m".split(), ("%", "")),
    **dict.fromkeys(".html .htm .xml .svg .md .vue .svelte".split(), ("<!--", " -->")),
    **dict.fromkeys(".css .scss .less".split(), ("/*", " */")),
}


def history_rules(scope: str) -> IgnoreRules:
    """The history's path rules for the scope rooted at ``scope`` (a directory), read now
    from its ignore files: :func:`kept` asks them."""
    return IgnoreRules(Path(scope))


def kept(rules: IgnoreRules, rel: str, text: str) -> bool:
    """Whether the history would keep the open buffer at ``rel`` (a POSIX path relative
    to the rules' root) holding ``text``: False for a path the index never reads
    (:meth:`storage.walk.IgnoreRules.excluded`: a credential file, an ignored file, a
    file in an ignored folder, ``.git/``), for the root itself, and for binary text
    (:func:`storage.indexer.is_binary`). Only a kept buffer joins the live history or
    becomes a cross-file source: what leaves the machine never holds what the history
    refuses to keep."""
    if not rel or rel == "." or rel.startswith("../"):
        return False
    if rules.excluded(rel, False):
        return False
    return not is_binary(text[:BINARY_SNIFF_CHARS].encode("utf-8", "surrogatepass"))


def header(rel: str) -> str:
    """The line that names a file before its text: its path in a line comment of its
    language, e.g. ``"# editors/server.py\\n"``, ``"// src/main.rs\\n"``."""
    p = PurePosixPath(rel)
    opener, closer = _COMMENT.get(p.suffix.lower()) or _COMMENT.get(p.name.lower()) or ("//", "")
    return f"{opener} {rel}{closer}\n"


def words(text: str) -> frozenset[str]:
    """The identifiers of ``text`` (3+ characters, the commonest keywords left out)."""
    return frozenset(_WORD.findall(text)) - _STOP


def similarity(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard similarity |a & b| / |a | b| in 0..1 (0 for two empty sets)."""
    return len(a & b) / len(a | b) if a or b else 0.0


@dataclass(frozen=True)
class Chunk:
    """``CHUNK_LINES`` lines of a source from line ``start`` (0-based), redacted, LF."""

    uri: str
    rel: str
    start: int
    text: str
    words: frozenset[str]


@dataclass
class _Source:
    scope: str
    rel: str
    text: str
    sha: str
    seq: int  # recency: higher = changed or saved more recently
    chunks: list[Chunk] | None = None  # of ``text``, made when first needed


@dataclass
class Pick:
    """The cross-file part chosen for one document: ``ids`` ([] for none) is the prompt's
    prefix while it stands."""

    scope: str
    line: int  # the cursor line it was chosen at
    budget: int
    sources: frozenset[str]  # the scope's open buffers it was chosen among
    chunks: list[Chunk]
    shas: dict[str, str]  # the chosen chunks' sources as they were (or still match)
    ids: list[int] = field(default_factory=list)


class CrossFile:
    """The ring of open buffers and the cross-file part chosen per document. One thread
    at a time (the completer's)."""

    def __init__(self) -> None:
        self._sources: dict[str, _Source] = {}
        self._picks: dict[str, Pick] = {}
        self._seq = 0

    def update(self, uri: str, scope: str, rel: str, text: str, sha: str) -> None:
        """The open buffer ``uri`` of ``scope`` (``rel``: its path in it) holds ``text``
        (``sha``: its digest); a changed one becomes the most recent source. The caller
        passes only buffers the history keeps (:func:`kept`), and drops (:meth:`drop`)
        one that it no longer keeps (an ignore file changed)."""
        src = self._sources.get(uri)
        if src is not None and src.sha == sha and src.scope == scope:
            return
        self._seq += 1
        self._sources[uri] = _Source(scope, rel, text, sha, self._seq)

    def touch(self, uri: str) -> None:
        """``uri`` was saved: the most recent source."""
        if uri in self._sources:
            self._seq += 1
            self._sources[uri].seq = self._seq

    def drop(self, uri: str) -> None:
        """A closed buffer leaves the ring (the choices that used it are made again)."""
        self._sources.pop(uri, None)
        self._picks.pop(uri, None)

    def drop_pick(self, uri: str) -> None:
        """Forget the choice made for document ``uri`` (cross-file context is off there)."""
        self._picks.pop(uri, None)

    def clear(self) -> None:
        self._sources.clear()
        self._picks.clear()

    def state(self) -> dict:
        return {"crossfile_sources": len(self._sources), "crossfile_picks": len(self._picks)}

    def pick(self, uri: str) -> Pick | None:
        return self._picks.get(uri)

    def context(self, uri: str, scope: str, rel: str, prefix: str, suffix: str, budget: int,
                tokenize: Callable[[str], list[int]]) -> list[int]:
        """Token ids of the cross-file part for the cursor between ``prefix`` and
        ``suffix`` (LF text) of document ``uri`` (``rel`` in ``scope``), at most
        ``budget`` tokens; [] when no other buffer of the scope has a similar chunk.
        The previous choice for ``uri`` is returned while it stands (module docstring)."""
        line = prefix.count("\n")
        in_scope = frozenset(u for u, s in self._sources.items() if s.scope == scope and u != uri)
        old = self._picks.get(uri)
        if old is not None and self._stands(old, scope, line, budget, in_scope):
            return old.ids
        pick = self._choose(uri, scope, rel, prefix, suffix, line, budget, in_scope, tokenize)
        self._picks[uri] = pick
        return pick.ids

    def _stands(self, pick: Pick, scope: str, line: int, budget: int,
                in_scope: frozenset[str]) -> bool:
        if (pick.scope != scope or pick.budget != budget or pick.sources != in_scope
                or abs(line - pick.line) > REGION_LINES):
            return False
        for c in pick.chunks:
            src = self._sources[c.uri]
            if pick.shas[c.uri] == src.sha:
                continue
            # A changed source: the chunk stands (stale, as chosen) while some chunk of the
            # new text is still close to it; an edit above it only shifts its lines.
            if max((similarity(c.words, n.words) for n in self._chunks(c.uri, src)),
                   default=0.0) < KEEP_SIMILARITY:
                return False
            pick.shas[c.uri] = src.sha
        return True

    def _choose(self, uri, scope, rel, prefix, suffix, line, budget, in_scope, tokenize) -> Pick:
        before, after = QUERY_LINES
        around = "\n".join(prefix.split("\n")[-before:] + suffix.split("\n")[:after])
        query = words(around)
        recent = sorted(in_scope, key=lambda u: -self._sources[u].seq)[:MAX_SOURCES]
        scored = []
        if query and budget > 0:
            for rank, u in enumerate(recent):
                for c in self._chunks(u, self._sources[u]):
                    score = similarity(query, c.words)
                    if score >= MIN_SIMILARITY:
                        scored.append((-score, rank, c.start, c))
        scored.sort(key=lambda x: x[:3])  # most similar first; ties: recent source, early line
        own = tokenize(header(rel)) if scored else []
        used, chosen, tries = len(own), [], 0
        for _, _, _, c in scored:
            if len(chosen) == MAX_CHUNKS or tries == 4 * MAX_CHUNKS or used >= budget:
                break
            if any(o.uri == c.uri and abs(o.start - c.start) < CHUNK_LINES for o, _ in chosen):
                continue  # overlaps a chosen chunk: the same lines twice
            tries += 1
            ids = tokenize(header(c.rel) + c.text)
            if used + len(ids) <= budget:
                chosen.append((c, ids))
                used += len(ids)
        chosen.reverse()  # the most similar nearest the document
        ids = [i for _, c_ids in chosen for i in c_ids] + own if chosen else []
        return Pick(scope, line, budget, in_scope, [c for c, _ in chosen],
                    {c.uri: self._sources[c.uri].sha for c, _ in chosen}, ids)

    def _chunks(self, uri: str, src: _Source) -> list[Chunk]:
        if src.chunks is None:
            text = redact(src.text, filename=PurePosixPath(src.rel).name).text
            lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
            src.chunks = []
            for start in range(0, max(1, len(lines) - CHUNK_STRIDE), CHUNK_STRIDE):
                body = lines[start:start + CHUNK_LINES]
                chunk = "\n".join(body).rstrip("\n") + "\n"
                if sum(bool(ln.strip()) for ln in body) < 2 or len(chunk) > CHUNK_MAX_CHARS:
                    continue
                w = words(chunk)
                if w:
                    src.chunks.append(Chunk(uri, src.rel, start, chunk, w))
        return src.chunks
