"""User acceptance of editor suggestions: shown, accepted, partially accepted, dismissed.

This is the user's verdict on a whole suggestion, a different quantity from the
Target's draft acceptance in the ledger (docs/design.md, 'Vocabulary'): the two are
stored in different tables and never added together. Accepted text also becomes history (source kind
``generated``), redacted like every stored text, so that what the user keeps is
drafted from next time.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from storage.secrets import redact
from storage.store import HistoryStore

OUTCOMES = ("accepted", "partial", "dismissed")


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

    def _put_generated(self, s: Served, text: str, tokenize, fingerprint: str) -> int:
        red = redact(text, filename=s.path)
        data = red.text.encode("utf-8")
        return self.store.put_document(
            scope=s.scope, path=f"{s.path}#suggestion-{s.id}", source_kind="generated",
            language_id=s.language_id, content_hash=hashlib.sha256(data).hexdigest(),
            num_bytes=len(data), mtime_ns=time.time_ns(), text=red.text,
            decoded_with_replacement=False, fingerprint=fingerprint,
            token_ids=tokenize(red.text), redactions=red.count,
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
