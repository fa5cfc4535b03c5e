"""A simulated fleet: N replayed agents, each with its own history or all sharing one.

    nice .venv/bin/python benchmarks/fleet.py [FILES... | --git REPO] [--agents 1 4 13]
        [--arms ARM...] [--k 16] [--store-cost] [--json OUT]

The recorded transcripts (default: the shared ones, read in place) are split into N
streams by session, round-robin in the order given (session i goes to agent i mod N);
each agent replays its stream's sessions one after the other, with `assistd replay`'s
oracle walk (:func:`assistd.measure.replay.walk_turn`), the `suffix` proposer as
`complete` builds it, k 16 and the flat cost model (tokens per Target call: a GPU's
view). The agents run side by side on one clock that counts model tokens: every
agent commits one token per tick, so agent a's turn starts at the model tokens its
stream has before it. A turn's tokens join a history when the turn *ends*; a turn
that starts earlier sees only the turns that ended before its start.

Arms, per N:

- ``silo``: one history per agent (a pod per agent, vLLM's in-memory global tree with
  sticky routing): an agent drafts from its own stream only.
- ``shared``: one history for every agent (what a shared, persistent store gives).
- ``silo+restart`` / ``shared+restart``: the same, every history lost at half the
  fleet's clock (an in-memory history across a rolling restart). A persistent store
  loses nothing, so ``shared`` is also the persisted arm.

The live request (the session so far) is each agent's own in every arm.

``--store-cost`` also measures what consulting a shared SQLite history costs a pod
per step, with the whole fleet's model turns in a real history file (as
benchmarks/proposer_latency.py does for the stdlib): loading the index, an idle
``sync`` (the poll a pod makes before a lookup), another writer's turn becoming
visible (``put_document`` on one connection, ``sync`` plus the next ``propose()`` on
another), and ``propose()`` over decode walks in the fleet's own turns.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.ground.costmodel import CostModel  # noqa: E402
from assistd.measure.replay import (  # noqa: E402
    ReplayCounts, ReplayHistory, TokenizedSession, build_proposer, metrics, percentile_ms,
    resolve_cost_model, walk_turn,
)

TRANSCRIPTS = ROOT.parent / "shared" / "fixtures" / "transcripts"
DEFAULT_DIRS = ("aider", "claude-code", "codex", "gemini-cli", "mini-swe-agent", "openhands",
                "swe-agent")  # the README's replay set: 13 sessions
ARMS = ("silo", "shared", "silo+restart", "shared+restart")


# ---------------------------------------------------------------- splitting and the clock


def split_streams(n_sessions: int, agents: int) -> list[list[int]]:
    """Session indices per agent, round-robin: session i goes to agent ``i % agents``.
    Raises ValueError unless ``1 <= agents <= n_sessions``.

    >>> split_streams(5, 2)
    [[0, 2, 4], [1, 3]]
    """
    if not 1 <= agents <= n_sessions:
        raise ValueError(f"agents must be between 1 and the {n_sessions} sessions, got {agents}")
    return [list(range(a, n_sessions, agents)) for a in range(agents)]


@dataclass(frozen=True, order=True)
class Event:
    """One model turn on the fleet's clock (in model tokens): it starts at ``start``,
    its tokens are visible to histories from ``end`` on. Sorted by (start, agent)."""

    start: int
    agent: int
    end: int
    session: int
    turn: int  # index into the session's ``turns``


def schedule(sessions: Sequence[TokenizedSession], streams: Sequence[Sequence[int]]) -> list[Event]:
    """Every model turn of every agent, in the order the fleet walks them: by start on
    the token clock, ties by agent. An agent's clock advances by each model turn's
    length; context turns (prompts, tool results) take no time.

    Worked example: agent 0 has turns of 3 and 2 model tokens, agent 1 one of 4:
    agent 0's turns run [0, 3) and [3, 5), agent 1's [0, 4); the walk order is
    (0, a0), (0, a1), (3, a0).
    """
    events = []
    for agent, stream in enumerate(streams):
        clock = 0
        for si in stream:
            for ti, (start, end, is_model, _) in enumerate(sessions[si].turns):
                if is_model and end > start:
                    events.append(Event(clock, agent, clock + end - start, si, ti))
                    clock += end - start
    return sorted(events)


def fleet_clock(events: Sequence[Event]) -> int:
    """The fleet's length on the clock: the last turn's end (0 for no turns)."""
    return max((e.end for e in events), default=0)


# ---------------------------------------------------------------- one arm


@dataclass
class ArmResult:
    """Raw counters of one arm: the replay's, drafts by source (``context``: the live
    request, ``history``), and how many times the histories were emptied."""

    counts: ReplayCounts = field(default_factory=ReplayCounts)
    drafts_by_source: dict[str, int] = field(default_factory=dict)
    restarts: int = 0


def run_arm(sessions: Sequence[TokenizedSession], streams: Sequence[Sequence[int]], *,
            shared: bool, restart_at: int | None, k: int, cost: CostModel,
            proposer: str = "suffix") -> ArmResult:
    """Walk the fleet once: ``shared`` one history for all agents, else one per agent;
    ``restart_at``: every history emptied at that clock (None: never). Returns the
    raw counters over all agents together."""
    events = schedule(sessions, streams)
    n_hist = 1 if shared else len(streams)
    out = ArmResult()

    def fresh():
        hists = [ReplayHistory() for _ in range(n_hist)]
        return hists, [build_proposer(proposer, h.index, cost) for h in hists]

    hists, props = fresh()
    pending: list[tuple[int, int, int, np.ndarray, str]] = []  # (end, seq, hist, tokens, name)
    seeded: set[int] = set()

    def flush(until: int) -> None:
        while pending and pending[0][0] <= until:
            _, _, h, tokens, name = heapq.heappop(pending)
            hists[h].add(tokens, name)

    for seq, ev in enumerate(events):
        if restart_at is not None and not out.restarts and ev.start >= restart_at:
            flush(restart_at)
            hists, props = fresh()
            out.restarts = 1
        flush(ev.start)
        h = 0 if shared else ev.agent
        s = sessions[ev.session]
        if ev.session not in seeded:  # documents put in the history before a session
            seeded.add(ev.session)
            for doc_name, ids in s.seed:
                hists[h].add(ids, doc_name)
        start, end, _, language = s.turns[ev.turn]
        prop = props[h]

        def propose(context, k_cap, lang, prop=prop):
            d = prop.propose(context, k_cap, scope="replay", language=lang)
            if d is not None and len(d.tokens):
                out.drafts_by_source[d.source] = out.drafts_by_source.get(d.source, 0) + 1
            return d

        walk_turn(propose, s.tokens, start, end, k, out.counts, language)
        heapq.heappush(pending, (ev.end, seq, h, s.tokens[start:end], f"{s.name}#{ev.turn}"))
    out.counts.ledger.draft_ms = float(sum(out.counts.propose_ms))
    return out


def arm_report(result: ArmResult, cost: CostModel) -> dict:
    """The arm's reported numbers, every rate computed from its counters."""
    m = metrics(result.counts, cost)
    drafts = sum(result.drafts_by_source.values())
    keep = ("tokens_per_call", "coverage", "acceptance_rate", "mean_acceptance_length",
            "rounds", "plain_steps", "committed_tokens", "propose_ms_p50", "propose_ms_p99")
    return {**{key: m[key] for key in keep},
            "drafts_by_source": dict(sorted(result.drafts_by_source.items())),
            "history_draft_share": result.drafts_by_source.get("history", 0) / drafts
            if drafts else None,
            "restarts": result.restarts}


def fleet_report(sessions: Sequence[TokenizedSession], agents: Sequence[int], k: int,
                 cost: CostModel, arms: Sequence[str] = ARMS, progress=print) -> dict:
    """``{N: {"streams": [...], arm: report}}`` for each N in ``agents``; N = 1 runs
    ``silo`` only (a single agent's history is the shared one)."""
    out = {}
    for n in agents:
        streams = split_streams(len(sessions), n)
        half = fleet_clock(schedule(sessions, streams)) // 2
        row: dict = {"streams": streams, "clock_tokens": 2 * half}
        for arm in arms:
            if n == 1 and arm.startswith("shared"):
                continue
            t0 = time.perf_counter()
            res = run_arm(sessions, streams, shared=arm.startswith("shared"),
                          restart_at=half if arm.endswith("+restart") else None, k=k, cost=cost)
            row[arm] = arm_report(res, cost)
            progress(f"N={n:<3d} {arm:15s} tokens/call {row[arm]['tokens_per_call']:.3f}"
                     f"  coverage {row[arm]['coverage']:.3f}  ({time.perf_counter() - t0:.0f} s)")
        out[n] = row
    return out


# ---------------------------------------------------------------- a shared SQLite history


def store_cost(sessions: Sequence[TokenizedSession], fingerprint: str, cost: CostModel, *,
               calls: int = 4000, context: int = 1024, seed: int = 0) -> dict:
    """What a pod pays per step to consult a shared SQLite history holding every model
    turn of ``sessions`` (ms; see the module docstring). Writes a temporary file."""
    from proposers.index import HistoryIndex
    from storage.store import HistoryStore

    scope = "/fleet"
    turns = [(f"{s.name}#{i}", s.tokens[a:b]) for s in sessions
             for i, (a, b, is_model, _) in enumerate(s.turns) if is_model and b > a]

    def put(store, name, ids):
        store.put_document(scope=scope, path=name, source_kind="transcript",
                           language_id="markdown", content_hash=name, num_bytes=len(ids),
                           mtime_ns=0, text="", decoded_with_replacement=False,
                           fingerprint=fingerprint, token_ids=ids.astype(np.uint32))

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "fleet.db"
        writer = HistoryStore(db)
        with writer.transaction():
            for name, ids in turns:
                put(writer, name, ids)
        reader = HistoryStore(db)  # another pod: its own connection and index
        index = HistoryIndex()
        t0 = time.perf_counter()
        index.load(reader, scope, fingerprint)
        load_ms = (time.perf_counter() - t0) * 1000
        n_tokens = index.tokens(scope)
        prop = build_proposer("suffix", index, cost)

        idle = []
        for _ in range(1000):
            t0 = time.perf_counter()
            index.sync(reader)
            idle.append((time.perf_counter() - t0) * 1000)

        # Another pod commits a turn: the time until this pod has it and has drafted.
        rng = np.random.default_rng(seed)
        visible = []
        for j in range(50):
            name, ids = turns[int(rng.integers(len(turns)))]
            put(writer, f"new/{j}/{name}", ids)
            t0 = time.perf_counter()
            index.sync(reader)
            prop.propose(ids[: max(1, len(ids) // 2)], 16, scope=scope)
            visible.append((time.perf_counter() - t0) * 1000)

        # propose(): decode walks of 32 steps (each committing 1-3 tokens) from random
        # cursors in the fleet's model turns, up to `context` tokens of live context.
        pool = [s.tokens for s in sessions if len(s.tokens) > 64]
        ms = []
        while len(ms) < calls:
            t = pool[int(rng.integers(len(pool)))]
            end = int(rng.integers(16, len(t)))
            for _ in range(32):
                if end > len(t) or len(ms) >= calls:
                    break
                ctx = t[max(0, end - context):end]
                t0 = time.perf_counter()
                prop.propose(ctx, 16, scope=scope)
                ms.append((time.perf_counter() - t0) * 1000)
                end += int(rng.integers(1, 4))
        reader.close()
        writer.close()
    return {
        "history_tokens": n_tokens, "documents": len(turns), "load_ms": load_ms,
        "sync_idle_ms_p50": percentile_ms(idle, 50), "sync_idle_ms_p99": percentile_ms(idle, 99),
        "commit_to_draft_ms_p50": percentile_ms(visible, 50),
        "commit_to_draft_ms_p99": percentile_ms(visible, 99),
        "propose_ms_p50": percentile_ms(ms, 50), "propose_ms_p99": percentile_ms(ms, 99),
        "propose_calls": len(ms),
    }


# ---------------------------------------------------------------- the driver


def load_sessions(paths: Sequence[Path], git_repo: Path | None = None, git_commits: int = 20
                  ) -> tuple[list[TokenizedSession], str]:
    """The sessions of transcript files (or of a repository's last commits, as
    `assistd replay --git` makes them) in the embedded Target's tokens, and its
    tokenizer fingerprint."""
    from assistd.measure.replay import tokenize_sessions
    from assistd.measure.replay_inputs import InputReport, git_sessions, transcript_sessions
    from assistd.targets.open import open_target

    report = InputReport()
    sessions = (git_sessions(git_repo, git_commits, report) if git_repo is not None
                else transcript_sessions(paths, report))
    target = open_target(None, n_ctx=256)
    try:
        return tokenize_sessions(sessions, target.tokenize), target.fingerprint
    finally:
        target.close()


def print_table(report: dict) -> None:
    print("\n| agents N | arm | tokens / Target call | coverage | acceptance | drafts from"
          " the history | propose p50 / p99 ms |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for n, row in report.items():
        for arm in ARMS:
            if arm in row:
                r = row[arm]
                share = r["history_draft_share"]
                print(f"| {n} | {arm} | {r['tokens_per_call']:.3f} | {r['coverage']:.3f} |"
                      f" {r['acceptance_rate']:.3f} | {'n/a' if share is None else f'{share:.2f}'} |"
                      f" {r['propose_ms_p50']:.2f} / {r['propose_ms_p99']:.2f} |")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=Path,
                    help="transcript files or folders [default: the shared transcripts]")
    ap.add_argument("--agents", type=int, nargs="+", default=[1, 4, 13])
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    ap.add_argument("--git", type=Path, metavar="REPO",
                    help="replay a repository's last commits instead (one session per"
                         " changed file, as `assistd replay --git`)")
    ap.add_argument("--git-commits", type=int, default=20)
    ap.add_argument("--store-cost", action="store_true",
                    help="also measure a shared SQLite history's per-step cost")
    ap.add_argument("--json", type=Path, help="write the whole report here")
    args = ap.parse_args(argv)
    files = args.files or [TRANSCRIPTS / d for d in DEFAULT_DIRS]
    t0 = time.perf_counter()
    sessions, fingerprint = load_sessions(files, args.git, args.git_commits)
    model = sum(s.model_tokens for s in sessions)
    print(f"{len(sessions)} sessions, {model:,} model tokens among"
          f" {sum(len(s.tokens) for s in sessions):,} ({time.perf_counter() - t0:.0f} s)")
    cost = resolve_cost_model("flat", None)
    bad = [n for n in args.agents if not 1 <= n <= len(sessions)]
    if bad:
        ap.error(f"--agents must be between 1 and {len(sessions)} (the sessions), got {bad}")
    report = {"k": args.k, "cost_model": "flat", "proposer": "suffix",
              "sessions": [s.name for s in sessions], "model_tokens": model,
              "fleet": fleet_report(sessions, args.agents, args.k, cost, args.arms)}
    print_table(report["fleet"])
    if args.store_cost:
        sc = report["store_cost"] = store_cost(sessions, fingerprint, cost)
        print(f"\nshared SQLite history: {sc['history_tokens']:,} tokens in {sc['documents']}"
              f" documents; load {sc['load_ms']:.0f} ms; idle sync p50"
              f" {sc['sync_idle_ms_p50']:.3f} / p99 {sc['sync_idle_ms_p99']:.3f} ms;"
              f" another writer's turn to a draft p50 {sc['commit_to_draft_ms_p50']:.2f} /"
              f" p99 {sc['commit_to_draft_ms_p99']:.2f} ms; propose() p50"
              f" {sc['propose_ms_p50']:.3f} / p99 {sc['propose_ms_p99']:.3f} ms"
              f" ({sc['propose_calls']} calls)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
