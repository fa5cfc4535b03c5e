"""vLLM's speculative decoding, drafted from assistd's history: a proposer class vLLM
loads with ``--speculative-config '{"method": "custom_class", "model":
"assistd.fleet.vllm_proposer.HistoryProposer", "num_speculative_tokens": 8}'``.

vLLM 0.32's custom proposer interface (``vllm/v1/spec_decode/custom_class_proposer.py``,
marked experimental, hence :data:`VLLM_VERSION`): the class is built as
``Cls(vllm_config)``; the CPU runner calls ``load_model(model)``; every engine step calls
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` and
takes one chain of draft ids per row. Row ``i``'s tokens so far are
``token_ids_cpu[i, :num_tokens_no_spec[i]]``; an empty ``sampled_token_ids[i]`` is a
request still in prefill (no draft). Rows carry no request id and are reordered between
steps, so nothing is kept per request: each row's draft is the suffix proposer's
(:class:`proposers.suffix.SuffixProposer`) over the row's tokens and the history, cut by
its cost model, at most ``num_speculative_tokens`` long.

The history is the daemon's SQLite file, opened read-only (the daemon writes it and
tokenizes it in the served model's token space: docs/scale.md), one scope per server,
re-read every ``refresh_s`` seconds for what the daemon wrote since
(:meth:`proposers.index.HistoryIndex.sync`). Its text was redacted when stored, so no
secret reaches a draft. Settings (:class:`FleetSettings`): ``ASSISTD_VLLM_*`` variables
over the ``[vllm]`` table of assistd's config file.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from assistd.ground.costmodel import CostModel
from assistd.ground.errors import InputError
from assistd.targets.remote.hf_vocab import HFVocab
from assistd.targets.spec import default_config_file, read_config_file
from proposers.index import HistoryIndex
from proposers.suffix import SuffixProposer
from storage.store import HistoryStore, default_db_path

# A child of vLLM's logger: its handler and level put these lines in the server's log.
log = logging.getLogger("vllm.assistd")

VLLM_VERSION = "0.32.0"  # the interface above, as read in this release
ENV_PREFIX = "ASSISTD_VLLM_"
LOG_EVERY = 2000  # engine steps between the step-time lines in the server's log


class FleetSettings(BaseModel):
    """The proposer's settings.

    db:         the history database (default ``$ASSISTD_DB``, else the daemon's default).
    scope:      the one history scope this server drafts from: a repository's root (as
                ``assistd index`` names it) or a transcript scope's name.
    tokenizer:  the served model's tokenizer (a Hugging Face folder or tokenizer.json);
                default the folder vLLM loaded the tokenizer from.
    cost:       t(n) the drafts are cut by: ``flat`` (a step costs the same whatever its
                drafts), ``reference`` (llama.cpp's t(n) on the reference 2-core CPU) or
                a cost-model JSON. Flat by default: in vLLM a step's fixed cost dominates,
                on its CPU build here too (benchmarks/vllm_proposers.py, fit cases, k 8:
                the reference curve cut drafts short, 1.56x / 2.21x vLLM without
                speculation on agent / edit, against 1.81x / 2.64x with flat); vLLM's
                own t(n) as the bench's oracle sweep measures it (t(9) = 1.4 t(1))
                moved tokens/s by -5% to +4%, within the noise.
    alpha, min_token_prob: the suffix proposer's draft caps (at most ``alpha`` tokens
                per matched token; stop below this cumulative estimate); None: its own
                (1 and 0.1). Looser caps did not pay in a paired run on the bench's fit
                cases (alpha 2: 0.93x / 1.07x; 8 and 0: 0.98x / 1.04x, agent / edit).
    refresh_s:  seconds between re-reads of what the daemon wrote.
    stats_file: where the step timings are written as JSON after every step (for
                benchmarks and tests), if anywhere.
    """

    model_config = ConfigDict(extra="forbid")

    db: Path | None = None
    scope: str
    tokenizer: Path | None = None
    cost: str = "flat"
    alpha: float | None = Field(None, gt=0, allow_inf_nan=False)
    min_token_prob: float | None = Field(None, ge=0, le=1)
    refresh_s: float = Field(2.0, gt=0, allow_inf_nan=False)
    stats_file: Path | None = None

    @field_validator("db", "tokenizer", "stats_file", mode="after")
    @classmethod
    def _home(cls, path: Path | None) -> Path | None:
        return None if path is None else path.expanduser()  # (a quoted "~/..." too)

    @field_validator("stats_file", mode="after")
    @classmethod
    def _writable(cls, path: Path | None) -> Path | None:
        if path is not None and not path.parent.is_dir():
            raise ValueError(f"{path.parent} is not a folder")
        return path

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None) -> FleetSettings:
        """``[vllm]`` of the config file (``$ASSISTD_CONFIG`` or the default), then
        ``ASSISTD_VLLM_*`` over it. Raises :class:`InputError` naming the bad setting."""
        environ = os.environ if environ is None else environ
        path = default_config_file(environ)
        table = read_config_file(path).get("vllm", {}) if path.exists() else {}
        if not isinstance(table, dict):
            raise InputError(f"config file {path}: [vllm] must be a table")
        values = dict(table)
        for name in cls.model_fields:
            if environ.get(ENV_PREFIX + name.upper()):
                values[name] = environ[ENV_PREFIX + name.upper()]
        if values.get("db") is None and environ.get("ASSISTD_DB"):
            values["db"] = environ["ASSISTD_DB"]
        try:
            return cls.model_validate(values)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(map(str, first["loc"])) or "settings"
            raise InputError(f"assistd's vLLM proposer: {ENV_PREFIX}{where.upper()} (or"
                             f" [vllm] {where} in {path}): {first['msg']}") from None


def cost_model(spec: str) -> CostModel:
    if spec == "reference":
        return CostModel.brief()
    if spec == "flat":
        return CostModel({1: 10.0, 128: 10.0}, source="flat")  # a round costs one forward
    return CostModel.load(spec)


def scope_name(scope: str) -> str:
    """A repository scope is its resolved root path (as the indexer stores it); any
    other name (a transcript scope) as given."""
    path = Path(scope).expanduser()
    return str(path.resolve()) if path.is_dir() else scope


class HistoryProposer:
    """vLLM's custom proposer over assistd's history (module docstring). Raises
    :class:`InputError` at construction for bad settings, a history without the scope,
    or one whose scope was tokenized by another tokenizer than the served model's."""

    def __init__(self, vllm_config, *, settings: FleetSettings | None = None):
        self.settings = s = settings or FleetSettings.load()
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        tokenizer = s.tokenizer or Path(vllm_config.model_config.tokenizer)
        self.vocab = HFVocab(tokenizer)
        self.fingerprint = self.vocab.fingerprint
        self.store = HistoryStore(s.db or default_db_path(), read_only=True)
        self.scope = scope_name(s.scope)
        self._check_scope()
        self.index = HistoryIndex(width=2 if self.vocab.n_vocab < 65535 else 4)
        self.index.ensure(self.store, self.scope, self.fingerprint)
        self.suffix = SuffixProposer(self.index, cost=cost_model(s.cost), alpha=s.alpha,
                                     min_token_prob=s.min_token_prob)
        self._synced = time.perf_counter()
        self._sync_failed = self._stats_failed = False
        self.steps = 0  # engine steps proposed for
        self.rows = 0  # rows drafted for (a step has one per running request)
        self.draft_tokens = 0
        self.step_ms: list[float] = []  # per step, the last STEP_WINDOW
        log.info("assistd history proposer: scope %s, %d documents, fingerprint %s, k %d",
                 self.scope, len(self.index.documents(self.scope)), self.fingerprint, self.k)

    STEP_WINDOW = 4096

    def _check_scope(self) -> None:
        counts = self.store.db.execute(
            "select t.tokenizer_fingerprint, count(*) from documents d join tokenizations t"
            " on t.document_id = d.id where d.scope = ? group by 1", [self.scope]).fetchall()
        by_fp = dict(counts)
        if not by_fp:
            raise InputError(f"the history {self.store.path} has no scope {self.scope!r}:"
                             " index it first (assistd index PATH, or the daemon's --repo)")
        if self.fingerprint not in by_fp:
            raise InputError(
                f"the history's scope {self.scope!r} was tokenized by another tokenizer"
                f" ({', '.join(sorted(by_fp))}) than the served model's ({self.fingerprint}):"
                " run the daemon with the served model's tokenizer (docs/scale.md)")

    def load_model(self, model) -> None:
        """vLLM's CPU runner calls this with the Target's weights: no draft model here."""

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec,
                token_ids_cpu, slot_mappings=None, **_) -> list[list[int]]:
        """One chain of draft ids per row (an empty one: no draft), at most
        ``num_speculative_tokens`` long. ``token_ids_cpu``: int array ``[max_num_reqs,
        max_model_len]``; ``num_tokens_no_spec``: int array, tokens per row."""
        start = time.perf_counter()
        if start - self._synced >= self.settings.refresh_s:
            self._synced = start
            try:
                self.index.sync(self.store)
            except Exception as e:  # noqa: BLE001 - a step of vLLM must never fail here
                # (a damaged or replaced file): draft from what is loaded, say it once
                if not self._sync_failed:
                    log.warning("assistd history proposer: cannot follow %s (%s: %s);"
                                " drafting from what was loaded", self.store.path,
                                type(e).__name__, e)
                self._sync_failed = True
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            if not len(sampled):  # a request still in (chunked) prefill
                drafts.append([])
                continue
            n = int(num_tokens_no_spec[i])
            context = np.asarray(token_ids_cpu[i, :n], dtype=np.int64)
            d = self.suffix.propose(context, self.k, scope=self.scope)
            drafts.append([] if d is None or d.is_tree else [int(t) for t in d.tokens[:self.k]])
            self.rows += 1
            self.draft_tokens += len(drafts[-1])
        self.steps += 1
        self.step_ms.append((time.perf_counter() - start) * 1000)
        if len(self.step_ms) > self.STEP_WINDOW:
            del self.step_ms[: len(self.step_ms) - self.STEP_WINDOW]
        if self.settings.stats_file is not None:  # (after the timing: not counted in it)
            self.write_stats()
        if self.steps % LOG_EVERY == 0:  # into vLLM's log: the proposer runs in every step
            log.info("assistd history proposer: %s", json.dumps(self.stats()))
        return drafts

    def stats(self) -> dict:
        """Step counts and the time ``propose`` took per engine step (ms: mean, p50,
        p95, max over the last :data:`STEP_WINDOW` steps)."""
        ms = np.asarray(self.step_ms) if self.step_ms else np.zeros(1)
        return {"steps": self.steps, "rows": self.rows, "draft_tokens": self.draft_tokens,
                "propose_ms": {"mean": round(float(ms.mean()), 3),
                               "p50": round(float(np.percentile(ms, 50)), 3),
                               "p95": round(float(np.percentile(ms, 95)), 3),
                               "max": round(float(ms.max()), 3)},
                "scope": self.scope, "k": self.k}

    def write_stats(self) -> None:
        """Write :meth:`stats` to ``stats_file`` (atomically); a failure is logged once and
        writing stops (the step goes on)."""
        path = self.settings.stats_file
        if path is None or self._stats_failed:
            return
        try:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(self.stats()))
            os.replace(tmp, path)
        except OSError as e:
            log.warning("assistd history proposer: cannot write %s (%s); not writing it"
                        " again", path, e)
            self._stats_failed = True
