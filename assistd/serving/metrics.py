"""``GET /metrics``: the daemon's counts in Prometheus' text exposition format.

One job: turn what the runtime already keeps into metric families, read at scrape time by
a custom collector on the app's own :class:`~prometheus_client.CollectorRegistry` (never
the process-global one). Nothing is counted here.

Metric names follow vLLM v1's speculative-decoding metrics under an ``assistd:`` prefix
(``vllm:spec_decode_*`` in ``vllm/v1/spec_decode/metrics.py``), labelled ``language``
(the LSP language id a generation ran under; ``plaintext`` by default) and ``proposer``
(``suffix``, ``ngram``, ``prediction``, ...; ``none`` is plain decoding). Like vLLM's,
they are **counters** since the daemon started (:attr:`Runtime.totals
<assistd.runtime.runtime.Runtime.totals>`, every generation's ledger summed), so
PromQL's ``rate()`` applies; the exposition adds ``_total``:

``assistd:spec_decode_num_drafts``
    Verification rounds that had a draft (the ledger's R; vLLM: drafts).
``assistd:spec_decode_num_draft_tokens``
    Draft tokens verified (D; a token tree counts every node it verified).
``assistd:spec_decode_num_accepted_tokens``
    Draft tokens accepted (C), the bonus token of each round not included.
``assistd:spec_decode_num_accepted_tokens_per_pos``
    Rounds whose draft position ``position`` was accepted, ``position`` counted from 0 as
    vLLM does (the ledger's ``accepted_per_position``); summed over positions it is C.

Acceptance rate is ``rate(accepted_tokens) / rate(draft_tokens)``, mean acceptance length
``1 + rate(accepted_tokens) / rate(drafts)``. A remote Target's server decodes: these stay
empty there (vLLM's own ``/metrics`` has its counts). The tuner's view, which fades with a
half-life of 7 days, stays in ``/v1/assistd/stats``.

``assistd:generation_tokens`` and ``assistd:prompt_tokens`` (counters)
    Tokens generated, and prompt tokens sent, since the daemon started, by every front end
    (``tokens_generated`` in ``/v1/assistd/stats``' ``daemon`` section).
``assistd:editor_suggestions_shown``, labelled ``language``
    Editor suggestions shown to the user (stored; a gauge: ``history forget`` deletes).
``assistd:editor_suggestions_outcome``, labelled ``language`` and ``outcome``
    Shown suggestions by the user's verdict: ``accepted``, ``partial`` or ``dismissed``
    (``user_acceptance`` in ``/v1/assistd/stats``; :mod:`storage.suggestions`). This is
    the user's acceptance of a whole suggestion, never added to the Target's draft
    acceptance above.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from assistd.ground.ledger import Ledger

PREFIX = "assistd:"
CONTENT_TYPE = CONTENT_TYPE_LATEST  # text/plain, the exposition version this client writes
OUTCOMES = ("accepted", "partial", "dismissed")  # storage.suggestions.OUTCOMES' order


@dataclass
class Snapshot:
    """What one scrape reads, at one moment.

    ledgers:     ``{(language, proposer): Ledger}``, decode counters since the daemon
                 started (:attr:`Runtime.totals`).
    suggestions: :meth:`storage.suggestions.SuggestionStore.summary`, per language id.
    tokens_generated: tokens generated since the daemon started (an int).
    """

    ledgers: dict[tuple[str, str], Ledger] = field(default_factory=dict)
    suggestions: dict[str, dict] = field(default_factory=dict)
    tokens_generated: int = 0
    prompt_tokens: int = 0


def read_snapshot(runtime) -> Snapshot:
    """The :class:`Snapshot` of ``runtime`` (a :class:`~assistd.runtime.runtime.Runtime`).
    Runs on the engine thread (the counters and the SQLite connection are the Runtime's);
    raises what the suggestion store raises (:class:`~assistd.ground.errors.HistoryError`)."""
    ledgers = {key: led.scaled(1.0) for key, led in runtime.totals.items()}  # copies
    suggestions = runtime.suggestions.summary() if runtime.suggestions is not None else {}
    return Snapshot(ledgers, suggestions, int(runtime.tokens_generated),
                    int(runtime.prompt_tokens))


class AssistdCollector:
    """A prometheus_client collector over ``read()``, called once per scrape (a
    :class:`Snapshot`; what it raises fails the scrape)."""

    def __init__(self, read: Callable[[], Snapshot]):
        self.read = read

    def describe(self) -> list[Metric]:
        return []  # names are not registered ahead: registering must not read the store

    def collect(self) -> Iterator[Metric]:
        snap = self.read()
        spec = ["language", "proposer"]
        drafts = CounterMetricFamily(
            PREFIX + "spec_decode_num_drafts", "Verification rounds with a draft.", labels=spec)
        draft_tokens = CounterMetricFamily(
            PREFIX + "spec_decode_num_draft_tokens", "Draft tokens verified.", labels=spec)
        accepted = CounterMetricFamily(
            PREFIX + "spec_decode_num_accepted_tokens",
            "Draft tokens accepted, bonus tokens excluded.", labels=spec)
        per_pos = CounterMetricFamily(
            PREFIX + "spec_decode_num_accepted_tokens_per_pos",
            "Rounds whose draft position (from 0) was accepted.", labels=spec + ["position"])
        for (language, proposer), led in sorted(snap.ledgers.items()):
            key = [language, proposer]
            drafts.add_metric(key, float(led.rounds))
            draft_tokens.add_metric(key, float(led.draft_tokens))
            accepted.add_metric(key, float(led.accepted_tokens))
            for pos, n in enumerate(led.accepted_per_position):
                per_pos.add_metric(key + [str(pos)], float(n))
        yield from (drafts, draft_tokens, accepted, per_pos)

        tokens = CounterMetricFamily(PREFIX + "generation_tokens",
                                     "Tokens generated since the daemon started.")
        tokens.add_metric([], float(snap.tokens_generated))
        prompt = CounterMetricFamily(PREFIX + "prompt_tokens",
                                     "Prompt tokens sent since the daemon started.")
        prompt.add_metric([], float(snap.prompt_tokens))
        yield from (tokens, prompt)

        shown = GaugeMetricFamily(PREFIX + "editor_suggestions_shown",
                                  "Editor suggestions shown to the user (stored).",
                                  labels=["language"])
        outcome = GaugeMetricFamily(
            PREFIX + "editor_suggestions_outcome",
            "Shown editor suggestions by the user's verdict (stored).",
            labels=["language", "outcome"])
        for language, u in sorted(snap.suggestions.items()):
            shown.add_metric([language], float(u["shown"] or 0))
            for name in OUTCOMES:
                outcome.add_metric([language, name], float(u[name] or 0))
        yield from (shown, outcome)


def metrics_registry(read: Callable[[], Snapshot]) -> CollectorRegistry:
    """A registry of its own holding one :class:`AssistdCollector` over ``read``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AssistdCollector(read))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The text exposition of ``registry`` (UTF-8 bytes; :data:`CONTENT_TYPE`). Blocks
    while the collector reads: call it off the event loop."""
    return generate_latest(registry)
