"""The run of ``assistd bench`` (:mod:`assistd.measure.bench`, whose docstring says what
is measured): :class:`Bench` runs every arm over a workload's cases on one Target, in an
order rotated from case to case and repeat to repeat, sums each arm's counters, and
checks every arm's output against plain decoding's."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from assistd.decoding.engine import generate
from assistd.decoding.tuner import K_MAX
from assistd.decoding.verify import NEAR_TIE_GAP
from assistd.ground.errors import InputError
from assistd.ground.ledger import Ledger
from assistd.ground.numerics import BASELINE_NUMERICS, first_difference
from assistd.measure.bench_arms import Arm
from assistd.measure.bench_ledger import ArmTotals, arm_row, measured_t
from assistd.measure.bench_workloads import Case, Workload
from assistd.runtime.runtime import Plan, Runtime, index_width
from proposers.prediction import PredictionProposer


def _short(name: str, width: int = 48) -> str:
    """A case name for a progress line: its end (the file and position), not its start."""
    return name if len(name) <= width else "…" + name[-(width - 1):]


class Bench:
    """Runs arms over workloads on one Target. ``library_peer``: a
    :class:`~assistd.measure.bench_arms.LlamaCppPromptLookup` (or None); ``draft``: an open draft-model Target;
    ``companions``: numerics mode -> :class:`~assistd.measure.bench_companion.Companion`
    for the ``plain:MODE`` arms."""

    def __init__(self, target, arms: Sequence[Arm], *, max_tokens: int, repeats: int,
                 cost, library_peer=None, draft=None, seed: int = 0, progress: Callable[[str, int], None] | None = None,
                 max_nodes: int = 64, companions: dict | None = None):
        if repeats < 1 or max_tokens < 1:
            raise InputError("--repeats and --max-tokens must be at least 1")
        self.max_nodes = max_nodes
        self.companions = companions or {}
        self._shapes: dict[str, list[tuple[int, int]]] = {}  # per arm, this case's first run
        self._place: dict[str, dict] = {}  # per prediction arm, this case's first run
        self.target, self.arms, self.max_tokens, self.repeats = target, list(arms), max_tokens, repeats
        self.cost, self.peer, self.draft = cost, library_peer, draft
        self.seed = seed
        self.progress = progress or (lambda desc, n: None)

    def steps(self, workloads: Sequence[Workload]) -> int:
        """Generations the run will make (for a progress bar)."""
        return sum(len(w.cases) for w in workloads) * self.repeats * len(self.arms)

    def _proposers(self, scope_index) -> dict[str, object]:
        """Every proposer arm's proposer over ``scope_index``, priced by the startup
        calibration (a tuned arm's generations get fresh ones, :meth:`_run`)."""
        return {arm.name: self._proposer(arm, scope_index, self.cost)
                for arm in self.arms if arm.proposer is not None and arm.kind != "prediction"}

    def _proposer(self, arm: Arm, scope_index, cost):
        from assistd.runtime.runtime import proposer_options
        from proposers import make_proposer

        options = proposer_options(arm.proposer, scope_index, cost, self.target,
                                   tree=arm.tree, max_nodes=self.max_nodes)
        if arm.proposer == "draft_model":
            options["draft"] = self.draft
        return make_proposer(arm.proposer, **options)

    def run_workload(self, w: Workload) -> dict:
        from assistd.decoding.tuner import Tuner, target_key
        from proposers.index import HistoryIndex

        scope = f"bench:{w.name}"
        index = HistoryIndex(width=index_width(self.target))
        doc_id = 0

        def put(docs):
            nonlocal doc_id
            for name, ids in docs:
                if len(ids):
                    doc_id += 1
                    index.put(scope, doc_id, ids, name)

        put(w.history)
        tuner = Tuner(None, target_key(self.target), self.cost, seed=self.seed)
        tuner.seed_costs(self.cost)
        # The workload's own runtime: its history and tuner live in memory only.
        rt = Runtime(self.target, None, tuner=tuner, index=index)
        proposers = self._proposers(index)
        totals = {a.name: ArmTotals() for a in self.arms}
        n_arms = len(self.arms)
        details = []  # per case with a prediction: the rewrite table's raw figures
        for ci, case in enumerate(w.cases):
            put(case.seed)
            self._prefill(case)
            self._warm(proposers, case, scope)
            first: dict[str, list[int]] = {}
            per_case = {a.name: [0, 0.0] for a in self.arms}
            self._shapes = {}
            self._place = {}
            for r in range(self.repeats):
                shift = (ci * self.repeats + r) % n_arms
                for arm in self.arms[shift:] + self.arms[:shift]:
                    tokens, committed, decode_ms, ledger = self._run(
                        arm, case, proposers.get(arm.name), rt, scope)
                    totals[arm.name].add(r, committed, decode_ms, ledger)
                    per_case[arm.name][0] += committed
                    per_case[arm.name][1] += decode_ms
                    first.setdefault(arm.name, tokens)
                    self.progress(f"{w.name}: {_short(case.name)}", 1)
            self._match(case, first, totals)
            if case.prediction is not None:
                details.append({"case": case.name, "kind": case.kind, "output": first["plain"],
                                "prediction": case.prediction, "arms": per_case,
                                "place": self._place})
        for arm in self.arms:
            if arm.kind == "peer-library":
                totals[arm.name].extra_memory_bytes = self.peer.memory_bytes
            elif arm.name in proposers:
                totals[arm.name].extra_memory_bytes = int(proposers[arm.name].memory_bytes)
        plain = totals["plain"]
        baseline = totals[self.baseline]
        # This workload's t(n): every chain forward of the main process's arms.
        mean_ctx = sum(len(c.prompt) for c in w.cases) / max(1, len(w.cases))
        t_ms = measured_t([totals[a.name].ledger for a in self.arms
                           if a.kind != "peer-library" and a.numerics is None
                           and not totals[a.name].ledger.tree_rounds],
                          lambda n: self.cost.t_ms(n, int(mean_ctx)))
        return {
            "name": w.name, "source": w.source, "description": w.description,
            "cases": len(w.cases), "prompt_tokens": sum(len(c.prompt) for c in w.cases),
            "history_tokens": w.history_tokens, "history_documents": w.history_documents,
            "k_max": K_MAX, "baseline": self.baseline,
            "t_ms": {str(n): round(t_ms(n), 3) for n in (1, 2, 3, 4, 6, 8, 12, 16)},
            "arms": [arm_row(a, totals[a.name], baseline, plain, t_ms) for a in self.arms],
            **(self._rewrite_rows(details, t_ms) if details else {}),
        }

    def _rewrite_rows(self, details: list[dict], t_ms) -> dict:
        """The rewrite table (:func:`assistd.measure.bench_rewrite.case_rows`) and its
        summary per case kind, against the baseline arm."""
        from assistd.measure.bench_rewrite import case_rows, summary

        rows = case_rows(details, t_ms, self.baseline)
        return {"rewrite": {"cases": rows, "summary": summary(rows)}}

    @property
    def baseline(self) -> str:
        """The arm every speedup is against: plain under :data:`BASELINE_NUMERICS` (a
        companion's, or the main process's when it runs that mode), else ``plain``."""
        name = f"plain:{BASELINE_NUMERICS}"
        return name if any(a.name == name for a in self.arms) else "plain"

    @staticmethod
    def _warm(proposers: dict, case: Case, scope: str) -> None:
        """One untimed propose() per proposer, like the prefill: the history index builds
        its search structures on the first lookup after documents arrive (~1 s for the
        3.4M-token standard library), which would otherwise land on whichever arm ran
        first (measured: an arm that drafted nothing at 0.48x plain on a short run)."""
        for prop in proposers.values():
            prop.propose(np.asarray(case.prompt, dtype=np.int64), 4, scope=scope,
                         language=case.language)

    def _prefill(self, case: Case) -> None:
        """Evaluate the prompt once on the Target, the companions and the library peer
        (untimed)."""
        generate(self.target, case.prompt, None, max_tokens=1, k=0)
        for companion in self.companions.values():
            companion.prefill(case.prompt)
        if self.peer is not None:
            self.peer.prefill(case.prompt)

    def _run(self, arm: Arm, case: Case, proposer, rt: Runtime, scope: str):
        """``(tokens, committed, decode ms, ledger or None)`` of one generation."""
        if arm.kind == "peer-library":
            tokens, ms = self.peer.generate(case.prompt, self.max_tokens)
            return tokens, len(tokens), ms, None
        if arm.numerics is not None:
            out = self.companions[arm.numerics].run(case.prompt, self.max_tokens)
            return (out["tokens"], out["committed"], out["decode_ms"],
                    Ledger.from_counters(out["counters"]))
        if proposer is not None and arm.proposer != "draft_model":
            # As Runtime.plan does for a completion: a proposer per generation, priced
            # by the tuner's cost model, learned from this loop's forwards (measured on 2
            # cores: 8-10% dearer than the startup calibration's back-to-back forwards).
            proposer = self._proposer(arm, rt.index, rt.tuner.cost_model())
        if arm.kind == "prediction":
            plan = self._prediction_plan(arm, case, rt)
        elif proposer is None:
            plan = Plan("none", None, 0, 0, None, case.language)
        elif arm.k == "auto":
            plan = Plan(arm.proposer, proposer, "auto", K_MAX,
                        rt.tuner.policy(arm.proposer, case.language), case.language)
        else:
            plan = Plan(arm.proposer, proposer, arm.k, arm.k, None, case.language)
        # Only the tuned arms teach the tuner; the fixed ones and the peers' rules do not.
        g = rt.run(case.prompt, plan, scope=scope, max_tokens=self.max_tokens,
                   record=arm.kind == "proposer" and arm.k == "auto")
        self._shapes.setdefault(arm.name, g.shapes)
        if arm.kind == "prediction" and isinstance(plan.draft, PredictionProposer):
            self._place.setdefault(arm.name, {"losses": plan.draft.losses,
                                              "refinds": plan.draft.refinds})
        return g.tokens, g.ledger.committed_tokens, g.ledger.decode_ms, g.ledger

    def _prediction_plan(self, arm: Arm, case: Case, rt: Runtime) -> Plan:
        """A prediction arm's plan, built as the API builds it for a request with a
        prediction (:meth:`assistd.runtime.decoders.LocalDecoder.with_prediction`): the
        case's prediction, with suffix inside for ``prediction+suffix``; without a
        prediction the inner proposer alone (or plain decoding)."""
        inner = None
        if arm.proposer == "prediction+suffix":
            inner = self._proposer(Arm("suffix", "proposer", "suffix", arm.k), rt.index,
                                   rt.tuner.cost_model())
        if inner is None and case.prediction is None:
            return Plan("none", None, 0, 0, None, case.language)
        k = K_MAX if arm.k == "auto" else arm.k
        plan = Plan("suffix", inner, arm.k, k, None, case.language)
        if case.prediction is None:
            return plan
        return rt.decoder.with_prediction(plan, case.prediction, start=len(case.prompt))

    def _match(self, case: Case, first: dict[str, list[int]], totals: dict) -> None:
        """Output match of every arm's first repeat against plain's (see the module)."""
        plain = first["plain"]
        traced = None
        batch_argmax: dict[int, int] = {}
        for arm in self.arms:
            tokens = first[arm.name]
            i = first_difference(tokens, plain)
            if i is None or arm.numerics is not None:
                totals[arm.name].matches.append({"case": case.name,
                                                 "status": "exact" if i is None else "numerics",
                                                 "first_diff": i, "gap": None,
                                                 "batch_argmax": None})
                continue
            if traced is None:
                traced = generate(self.target, case.prompt, None, max_tokens=self.max_tokens,
                                  k=0, trace=True)
            j = first_difference(tokens, traced.tokens)
            gap, batch, replay = None, None, None
            if j is None:  # plain itself did not reproduce; the arm matches the traced run
                status = "near-tie"
            else:
                gap = traced.top2_gaps[j] if j < len(traced.top2_gaps) else None
                status = "near-tie" if gap is not None and gap < NEAR_TIE_GAP else "differs"
                if j < len(tokens) and j < len(traced.tokens):
                    if j not in batch_argmax:
                        batch_argmax[j] = self._batch_argmax(case.prompt + traced.tokens[:j])
                    batch = batch_argmax[j] == tokens[j]
                    shapes = self._shapes.get(arm.name)
                    if shapes:
                        r = self._replay_argmax(case.prompt, tokens, shapes, j)
                        replay = None if r is None else r == tokens[j]
            totals[arm.name].matches.append({
                "case": case.name, "status": status, "first_diff": i if j is None else j,
                "gap": None if gap is None else round(float(gap), 4), "batch_argmax": batch,
                "replay_argmax": replay})

    def _replay_argmax(self, prompt: list[int], tokens: list[int],
                       shapes: list[tuple[int, int]], j: int) -> int | None:
        """The Target's argmax for output position ``j`` with the arm's own forwards
        replayed: the prompt prefilled, then each step's kept rows evaluated in a batch of
        the step's size (the rejected rows padded with a repeat: ggml picks its kernels
        by a batch's size, and a row's result never depends on the other rows' values).
        That reproduces the arm's logits (the test past 512 cells checks it on the
        default numerics), so a token that is not this argmax would be a verification
        fault. None for a tree round."""
        t = self.target
        t.truncate(0)
        t.evaluate(prompt[:-1], [])
        ctx = list(prompt) + list(tokens)
        n = len(prompt)  # committed tokens; the KV cache holds n - 1
        for rows, kept in shapes:
            if rows == 0:
                return None
            batch = ctx[n - 1 : n - 1 + kept]
            batch += [batch[-1]] * (rows - len(batch))
            first = n - len(prompt)  # the output index this step's row 0 predicts
            if first <= j < first + kept:
                return int(np.argmax(t.evaluate(batch, [j - first])[0]))
            t.evaluate(batch, [])
            t.truncate(n - 1 + kept)
            n += kept
        return None

    def _batch_argmax(self, tokens: list[int]) -> int:
        """The Target's argmax after ``tokens``, all evaluated afresh in one batch (as a
        prefill): with ``_match``'s verdict, whether batch shape would have picked the
        arm's token (with llama.cpp's fast numerics it does, up to 1.7 logits away)."""
        self.target.truncate(0)
        row = self.target.evaluate(tokens, [len(tokens) - 1])[0]
        return int(np.argmax(row))
