"""User acceptance of editor suggestions: shown, accepted, partially accepted, dismissed.

This is the user's verdict on a whole suggestion, a different quantity from the
Target's draft acceptance in the ledger (docs/design.md, 'Vocabulary'): the two are
stored in different tables and never added together. Accepted text also becomes history (source kind
``generated``), so that what the user keeps is drafted from next time. It is redacted with
the text around it in the document (:func:`line_context`): a suggestion ``PW"`` after
``db_password = "`` is a password, though ``PW"`` alone is nothing to the secret filter.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from storage.secrets import REDACTED, redact
from storage.store import HistoryStore

OUTCOMES = ("accepted", "partial", "dismissed")
CONTEXT_LINES = 20  # lines before a suggestion that its redaction reads (fences, "key is:" lines)
CONTEXT_CHARS = 4096  # ... and characters at most, before it and after it on its line


def line_context(prefix: str, suffix: str) -> tuple[str, str]:
    """What :class:`Served` keeps of the document around a suggestion: ``(before, after)``.

    ``before``: the last :data:`CONTEXT_LINES` lines of ``prefix`` (the text before the
    cursor; the last one unfinished), at most :data:`CONTEXT_CHARS` characters. ``after``:
    the rest of the cursor's line in ``suffix`` (up to its newline), at most as many.

    >>> line_context("a\\nb\\npassword = '", "' # ok\\nnext")
    ("a\\nb\\npassword = '", "' # ok")
    """
    start = len(prefix)
    for _ in range(CONTEXT_LINES):
        start = prefix.rfind("\n", 0, start)
        if start < 0:
            break
    before = prefix[start + 1:] if start >= 0 else prefix
    before = before[-CONTEXT_CHARS:]
    end = suffix.find("\n")
    after = suffix if end < 0 else suffix[:end]
    return before, after[:CONTEXT_CHARS]


@dataclass(frozen=True)
class Served:
    """What the server remembers of a suggestion until the editor reports on it."""

    id: str
    scope: str | None
    path: str  # relative to scope (or the URI when there is no scope)
    language_id: str
    proposer: str
    target: str
    text: str
    # The document around the suggestion (see line_context): its redaction reads them, and
    # they are never stored. Empty when the front end does not give them.
    before: str = ""
    after: str = ""


class SuggestionStore:
    """Events on suggestions, persisted in the history store (one transaction each)."""

    def __init__(self, store: HistoryStore):
        self.store = store

    def event(self, s: Served, event: str, *, accepted_chars: int = 0,
              tokenize=None, fingerprint: str | None = None, now: float | None = None) -> int | None:
        """Record ``event`` ("shown", "accepted", "partial" or "dismissed") for ``s``.

        An outcome never goes back: "dismissed" after "accepted" is ignored, "accepted"
        after "partial" upgrades it. For accepted/partial text with ``tokenize`` and
        ``fingerprint`` (the Target's), the accepted characters are stored as a
        ``generated`` history document in ``s.scope``; returns its id (else None).
        Raises ValueError for an unknown event.
        """
        if event not in ("shown", *OUTCOMES):
            raise ValueError(f"unknown suggestion event {event!r}")
        now = time.time() if now is None else now
        chars = len(s.text)
        accepted_chars = max(0, min(int(accepted_chars), chars))
        if event == "accepted":
            accepted_chars = chars
        doc_id = None
        with self.store.transaction() as c:
            row = c.execute("select outcome, accepted_chars from suggestions where id = ?",
                            [s.id]).fetchone()
            if row is None:
                c.execute(
                    "insert into suggestions (id, scope, path, language_id, proposer, target,"
                    " chars, shown, outcome, accepted_chars, created_utc, updated_utc)"
                    " values (?,?,?,?,?,?,?,0,null,0,?,?)",
                    [s.id, s.scope or "", s.path, s.language_id, s.proposer, s.target, chars,
                     now, now])
                old_outcome, old_chars = None, 0
            else:
                old_outcome, old_chars = row
            if event == "shown":
                c.execute("update suggestions set shown = 1, updated_utc = ? where id = ?",
                          [now, s.id])
                return None
            rank = {None: 0, "dismissed": 1, "partial": 2, "accepted": 3}
            if rank[event] < rank[old_outcome] or (event == old_outcome and accepted_chars <= old_chars):
                return None
            if event == "dismissed" and old_outcome is not None:
                return None
            c.execute("update suggestions set shown = 1, outcome = ?, accepted_chars = ?,"
                      " updated_utc = ? where id = ?",
                      [event, max(accepted_chars, old_chars), now, s.id])
            kept = s.text[:accepted_chars]
            if event != "dismissed" and kept.strip() and s.scope and tokenize is not None:
                doc_id = self._put_generated(s, kept, tokenize, fingerprint)
        return doc_id

    def _put_generated(self, s: Served, text: str, tokenize, fingerprint: str) -> int | None:
        stored, count = redact_in_context(s.before, text, s.after, filename=s.path)
        if stored is None:
            return None
        data = stored.encode("utf-8", "surrogatepass")
        return self.store.put_document(
            scope=s.scope, path=f"{s.path}#suggestion-{s.id}", source_kind="generated",
            language_id=s.language_id, content_hash=hashlib.sha256(data).hexdigest(),
            num_bytes=len(data), mtime_ns=time.time_ns(), text=stored,
            decoded_with_replacement=False, fingerprint=fingerprint,
            token_ids=tokenize(stored), redactions=count,
        )

    def summary(self) -> dict:
        """Per language id: shown, accepted, partial, dismissed, accepted chars, the
        acceptance rate (accepted or partial / shown) and the mean accepted characters
        per accepted suggestion (whole or partial; None while there is none)."""
        out = {}
        rows = self.store.db.execute(
            "select language_id, sum(shown), sum(outcome = 'accepted'), sum(outcome = 'partial'),"
            " sum(outcome = 'dismissed'), sum(accepted_chars), count(*) from suggestions"
            " group by language_id order by language_id").fetchall()
        for lang, shown, acc, part, dis, chars, n in rows:
            out[lang] = {"suggestions": n, "shown": shown, "accepted": acc, "partial": part,
                         "dismissed": dis, "accepted_chars": chars,
                         "acceptance_rate": (acc + part) / shown if shown else None,
                         "mean_accepted_chars": chars / (acc + part) if acc + part else None}
        return out


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def redact_in_context(before: str, text: str, after: str, *,
                      filename: str = "") -> tuple[str | None, int]:
    """``text`` as it may be stored, when it sits between ``before`` and ``after`` in a
    document: ``(stored text, redactions)``; ``(None, 0)`` when it cannot be told apart
    from its context (nothing is stored then).

    The filter runs over ``before + text + after``, the lines ``text`` ends up on, and
    ``text``'s own stretch of the result is kept. A value that starts in ``before`` (a
    suggestion accepted from inside a token) is kept as one ``[REDACTED]`` at the start.
    The result passes the filter on its own too.

    >>> redact_in_context('db_password = "', 'Tr0ub4dor-Xq7Lm"', "")
    ('[REDACTED]"', 1)
    >>> redact_in_context("return ", "a + b", "")
    ('a + b', 0)
    """
    nl = before.rfind("\n") + 1
    upper, line = before[:nl], before[nl:]
    whole = redact(before + text + after, filename=filename)
    out = text
    if whole.count:
        out = whole.text
        # Lines above the suggestion's own are redacted as they are alone (the rules that
        # read a line above a value only change the value's line): strip them as such.
        head = redact(upper, filename=filename).text if upper else ""
        if not out.startswith(head):
            return None, 0
        out = out[len(head):]
        p = _snap(out, _common_prefix(out, line))
        end = _snap(out, len(out) - _common_prefix(out[p:][::-1], after[::-1]), to_end=True)
        out = out[p:end]
    alone = redact(out, filename=filename)
    return alone.text, max(0, alone.text.count(REDACTED) - text.count(REDACTED))


def _snap(text: str, pos: int, *, to_end: bool = False) -> int:
    """``pos`` moved out of a ``[REDACTED]`` it falls inside, to its start (or its end):
    ``x = [`` before the cursor is a common prefix with ``x = [REDACTED]``."""
    i = text.find(REDACTED, max(0, pos - len(REDACTED) + 1))
    if 0 <= i < pos:
        return i + len(REDACTED) if to_end else i
    return pos
