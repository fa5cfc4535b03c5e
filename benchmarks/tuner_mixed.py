"""The tuner on a mixed real workload: k=auto against plain decoding and every fixed k.

    .venv/bin/python benchmarks/tuner_mixed.py [--prompts 8] [--max-tokens 56] [--seed 0]
        [--types python,markdown,json,transcript] [--warmup-rounds 200] [--json FILE]

What it measures (issue 6, "tuner"), with the real embedded Target (SmolLM2-135M Q4_1
GGUF on llama.cpp, ``open_target(None)``) and the ``suffix`` proposer, through the
one engine path the CLI uses (``assistd.runtime.session.complete_at``: index the scope, draft
from its history, verify, record the ledger into the tuner):

- per file type, decode tokens/s (Σ committed tokens / Σ decode seconds, prefill
  excluded) of plain decoding (k=0), fixed k in {1, 2, 4, 8, 16} and k=auto; auto's
  ratio to plain and to the best fixed k of that type, and the ceilings the tuner chose
  (``Completion.tuned['k']``, exploration steps aside);
- overall (all types together), tokens/s per config and auto / the best single fixed k;
- the goals: auto >= 0.90x the type's best fixed k; overall auto >= 1.2x the best
  global fixed k; auto >= 0.95x plain for every type whose warm-up reached
  ``--warmup-rounds`` rounds (judged only there, and the rounds are printed);
- greedy output of every speculative config against plain, token by token: a
  difference is counted (a batched-numerics near-tie, docs/design.md, 'Exactness'), never a failure.

Workload (real text on this machine, no network), one temporary directory per type as
the history scope (files are copied there; nothing is written into the repository):

- python: ``--history-files`` modules of the standard library (``sysconfig`` stdlib,
  tests and site-packages excluded, 2-200 KB);
- markdown: ``.md`` files of the venv's site-packages and /usr/share/doc (2-200 KB);
- json: ``.json`` files of site-packages and /usr/share, 2-200 KB, that parse; minified
  files (under 20 lines or over 200 characters per line on average) are skipped: a
  cursor goes at a line start, and a one-line file has one;
- transcript: the real coding-agent transcripts of ../shared/fixtures/transcripts
  (files named ``*synthetic*`` skipped), read in place with ``storage.transcripts``
  through ``assistd.measure.replay_inputs``. A prompt is the conversation before one model turn
  (every turn's text, joined by blank lines), the continuation is the agent's next
  output. The scope's history holds the model-output records (what the transcript
  ingester stores) of every other session and of this session's earlier turns, never
  the turn being completed or later ones; it is brought to that state before each
  prompt. Prompts are drawn round-robin over sessions, so that one long aider history
  does not make up the whole type. Language id ``transcript``.

For files, the prompt is the file up to a random line start (seeded; at least 256
characters on either side); ``complete_at`` keeps its last 1,024 tokens. By default
the file is itself in the history (an editor completing inside an indexed file, so the
text after the cursor is in the history too); ``--holdout`` draws prompt files from
outside the scope instead (new text). Measured and warm-up prompts come from different
files where there are enough.

Configs run back to back on the same prompt, in an order rotated from prompt to
prompt, so that drift in the machine's speed hits all alike; the Target keeps its KV
cache, so only the first config of a prompt prefills it (prefill is not in the decode
times anyway). Each config has its own tuner (:class:`assistd.decoding.tuner.Tuner`) on its own
temporary SQLite :class:`storage.ledger_store.LedgerStore`, seeded as ``Tuner.open``
seeds a fresh store (points counted as 3 forwards), so fixed-k generations never feed
the auto tuner. The auto tuner's seed is one calibration of t(n)
(``CostModel.calibrate``, measured once). The plain and fixed-k tuners are made after
the warm-up, seeded with the t(n) the auto tuner then holds (calibration plus the
forwards it measured): in real use every ceiling adds to the Target's one cost table in
the store, and the suffix proposer's cost cut reads it, so every config starts the
measured pass from the same t(n) (``--fixed-cost calibration``: from the calibration
instead). The auto tuner uses the default exploration share and ``--seed``.

Warm-up: before the measured pass, k=auto runs alone on separate warm-up prompts of each
type, types round-robin, until its tuner has observed ``--warmup-rounds`` verification
rounds of that type; or, where the tuner has turned speculation off for the type (it
chooses k=0, so rounds come only from exploration), as many decode steps; or
``--warmup-max-prompts`` prompts. The rounds and steps observed are printed per type.
Warm-up completions are ``--warmup-max-tokens`` (128) long, longer than the measured
ones: prefilling a 1,024-token prompt costs ~4.5 s here (prefill at ~230 tokens/s) against
~0.5 s for 56 new tokens, so longer completions buy the tuner its rounds at a third of
the time (its counters are per step; pass ``--warmup-max-tokens 56`` to warm up on
completions exactly like the measured ones).

Time: mostly prefill (~4.5 s per 1,024-token prompt on 2 idle cores, paid once per
measured prompt and once per warm-up prompt). A ``--prompts 2 --warmup-rounds 20`` run
on a half-busy 2-core machine took ~17 s per measured prompt (7 configs) and ~12 s per
warm-up prompt, ~29 rounds each; the defaults (~7 warm-up prompts and 8 measured ones
per type) thus take ~15 minutes there and about half that on idle cores. The CPU must be
idle: llama.cpp's threads wait on each other when other work holds a core, and a
busy machine shows up as a t(1) far above ~11 ms in the calibration line (warned).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import sysconfig
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from assistd.ground.costmodel import BRIEF_CPU_POINTS, CostModel  # noqa: E402
from assistd.ground.numerics import first_difference  # noqa: E402
from assistd.measure.replay_inputs import InputReport, transcript_sessions  # noqa: E402
from assistd.targets.open import open_target  # noqa: E402
from assistd.runtime.runtime import Runtime  # noqa: E402
from assistd.runtime.session import complete_at  # noqa: E402
from assistd.decoding.tuner import Tuner, target_key  # noqa: E402
from storage.indexer import find_repository_root  # noqa: E402
from storage.ledger_store import LedgerStore  # noqa: E402
from storage.secrets import redact  # noqa: E402
from storage.store import HistoryStore  # noqa: E402

TYPES = ("python", "markdown", "json", "transcript")
LANGUAGE = {"python": "python", "markdown": "markdown", "json": "json",
            "transcript": "transcript"}
FIXED_K = (1, 2, 4, 8, 16)
CONFIGS = ("plain",) + tuple(f"k={k}" for k in FIXED_K) + ("auto",)
PROPOSER = "suffix"
TRANSCRIPTS = ROOT.parent / "shared" / "fixtures" / "transcripts"
MIN_BYTES, MAX_BYTES = 2_000, 200_000
MIN_SIDE_CHARS = 256  # text on either side of a file cursor


def k_of(config: str) -> int | str:
    return 0 if config == "plain" else "auto" if config == "auto" else int(config[2:])


# ---------------------------------------------------------------- workload


@dataclass
class Prompt:
    """One cursor: the text before it, where it is, and (transcripts) the history state."""

    kind: str
    name: str  # file:line or session#turn
    text: str
    session: int | None = None  # transcripts: the session and model turn completed
    turn: int | None = None


@dataclass
class Workload:
    """One file type: its history scope directory and its prompts."""

    kind: str
    scope_dir: Path
    measured: list[Prompt]
    warmup: list[Prompt]
    history_docs: int
    history_bytes: int
    transcripts: TranscriptHistory | None = None


def _read_text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
        if not MIN_BYTES <= len(data) <= MAX_BYTES or b"\0" in data[:8192]:
            return None
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _candidates(kind: str) -> list[Path]:
    purelib = Path(sysconfig.get_paths()["purelib"])
    if kind == "python":
        std = Path(sysconfig.get_paths()["stdlib"])
        skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
        return sorted(p for p in std.rglob("*.py") if not skip & set(p.relative_to(std).parts))
    if kind == "markdown":
        return sorted(purelib.rglob("*.md")) + sorted(Path("/usr/share/doc").rglob("*.md"))
    if kind == "json":
        return sorted(purelib.rglob("*.json")) + sorted(Path("/usr/share").rglob("*.json"))
    raise ValueError(kind)


def _usable(kind: str, text: str) -> bool:
    if kind == "json":
        lines = text.count("\n") + 1
        if lines < 20 or len(text) / lines > 200:
            return False  # minified: no line starts to put a cursor at
        try:
            json.loads(text)
        except ValueError:
            return False
    return True


def _cut(text: str, rng: random.Random) -> int | None:
    """A random line start with at least MIN_SIDE_CHARS on either side."""
    starts = [i + 1 for i, ch in enumerate(text) if ch == "\n"
              and MIN_SIDE_CHARS <= i + 1 <= len(text) - MIN_SIDE_CHARS]
    return rng.choice(starts) if starts else None


def file_workload(kind: str, work: Path, rng: random.Random, n_measured: int,
                  n_warmup: int, n_history: int, holdout: bool) -> Workload:
    """Copy ``n_history`` seeded files of ``kind`` into a scope directory; cut prompts."""
    paths = _candidates(kind)
    rng.shuffle(paths)
    files, seen = [], set()
    need = n_history + (n_measured + n_warmup if holdout else 0)
    for p in paths:
        text = _read_text(p)
        if text is None or not _usable(kind, text):
            continue
        digest = hashlib.sha1(text.encode()).hexdigest()
        if digest in seen:  # the same LICENSE.md in five packages
            continue
        seen.add(digest)
        files.append((p, text))
        if len(files) >= need:
            break
    if len(files) < 2:
        raise SystemExit(f"{kind}: found {len(files)} usable files; nothing to benchmark")
    scope = work / kind
    scope.mkdir()
    history = files[:n_history]
    for i, (p, text) in enumerate(history):
        (scope / f"{i:03d}_{p.name}").write_text(text)
    pool = files[n_history:] if holdout and len(files) > n_history else history

    def prompts(sources, n):
        out = []
        for j in range(n):
            p, text = sources[j % len(sources)]
            cut = _cut(text, rng)
            if cut is None:
                continue
            line = text.count("\n", 0, cut) + 1
            out.append(Prompt(kind, f"{p.name}:{line}", text[:cut]))
        return out

    # Measured prompts from the first files, warm-up prompts from the others.
    split = min(n_measured, max(1, len(pool) // 2))
    return Workload(kind, scope, prompts(pool[:split], n_measured),
                    prompts(pool[split:] or pool, n_warmup), len(history),
                    sum(len(t.encode()) for _, t in history))


class TranscriptHistory:
    """The transcript scope's documents: model-output records, as the ingester stores
    them (redacted, ``source_kind='transcript'``), kept to "everything but the session
    being completed from its current turn on" before each prompt."""

    def __init__(self, store: HistoryStore, scope: str, sessions, tokenize, fingerprint):
        self.store, self.scope, self.sessions = store, scope, sessions
        self.tokenize, self.fingerprint = tokenize, fingerprint
        self.records = {(s, t): turn for s, sess in enumerate(sessions)
                        for t, turn in enumerate(sess.turns) if turn.is_model}
        self.present: dict[tuple[int, int], int] = {}  # record -> document id
        self._ids: dict[tuple[int, int], tuple[str, list[int]]] = {}

    def sync(self, session: int | None = None, turn: int | None = None) -> None:
        wanted = {key for key in self.records
                  if session is None or key[0] != session or key[1] < turn}
        gone = [self.present.pop(key) for key in list(self.present) if key not in wanted]
        self.store.remove_documents(gone)
        for key in sorted(wanted - self.present.keys()):
            turn_ = self.records[key]
            if key not in self._ids:
                clean = redact(turn_.text).text
                self._ids[key] = (clean, self.tokenize(clean))
            clean, ids = self._ids[key]
            raw = turn_.text.encode("utf-8", "surrogatepass")
            source = self.sessions[key[0]].name
            self.present[key] = self.store.put_document(
                scope=self.scope, path=f"{source}#turn{key[1]}", source_kind="transcript",
                language_id=turn_.language or "markdown",
                content_hash=hashlib.sha256(raw).hexdigest(),
                num_bytes=len(clean.encode("utf-8", "replace")), mtime_ns=0, text=clean,
                decoded_with_replacement=False, fingerprint=self.fingerprint, token_ids=ids,
                source=source, record_key=f"turn{key[1]}", ordinal=key[1],
                record_kind=turn_.role)


def transcript_workload(work: Path, rng: random.Random, n_measured: int, n_warmup: int,
                        store: HistoryStore, target) -> Workload:
    if not TRANSCRIPTS.is_dir():
        raise SystemExit(f"transcript fixtures not found at {TRANSCRIPTS}; drop the type with"
                         " --types python,markdown,json")
    report = InputReport()
    sessions = [s for s in transcript_sessions([TRANSCRIPTS], report)
                if "synthetic" not in Path(s.name).name]
    scope_dir = work / "transcript"
    scope_dir.mkdir()
    scope = str(find_repository_root(scope_dir))
    hist = TranscriptHistory(store, scope, sessions, target.tokenize, target.fingerprint)
    # Eligible: model turns of at least 100 characters after at least 256 of conversation.
    by_session: dict[int, list[int]] = {}
    for s, sess in enumerate(sessions):
        before = 0
        for t, turn in enumerate(sess.turns):
            if turn.is_model and len(turn.text) >= 100 and before >= MIN_SIDE_CHARS:
                by_session.setdefault(s, []).append(t)
            before += len(turn.text) + 2
    order = list(by_session)
    rng.shuffle(order)
    for s in order:
        rng.shuffle(by_session[s])
    picked = []
    while len(picked) < n_measured + n_warmup and any(by_session.values()):
        for s in order:
            if by_session[s] and len(picked) < n_measured + n_warmup:
                picked.append((s, by_session[s].pop()))
    prompts = []
    for s, t in picked:
        sess = sessions[s]
        text = "\n\n".join(turn.text for turn in sess.turns[:t]) + "\n\n"
        prompts.append(Prompt("transcript", f"{Path(sess.name).name}#{t}", text, s, t))
    hist.sync()
    docs = len(hist.records)
    nbytes = sum(len(turn.text.encode()) for turn in hist.records.values())
    return Workload("transcript", scope_dir, prompts[:n_measured], prompts[n_measured:],
                    docs, nbytes, transcripts=hist)


# ---------------------------------------------------------------- running


@dataclass
class Totals:
    """Raw counters summed over generations (rates on read)."""

    generations: int = 0
    tokens: int = 0
    decode_ms: float = 0.0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    rounds: int = 0
    steps: int = 0
    mismatches: int = 0  # generations whose tokens differ from plain's
    chosen_k: Counter = field(default_factory=Counter)

    def add(self, ledger) -> None:
        self.generations += 1
        self.tokens += ledger.committed_tokens
        self.decode_ms += ledger.decode_ms
        self.draft_tokens += ledger.draft_tokens
        self.accepted_tokens += ledger.accepted_tokens
        self.rounds += ledger.rounds
        self.steps += ledger.rounds + ledger.plain_steps

    @property
    def tokens_per_s(self) -> float:
        """Σ committed tokens / Σ decode seconds."""
        return self.tokens / (self.decode_ms / 1000) if self.decode_ms > 0 else 0.0

    def as_dict(self) -> dict:
        return {"generations": self.generations, "tokens": self.tokens,
                "decode_ms": round(self.decode_ms, 1), "tokens_per_s": self.tokens_per_s,
                "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "rounds": self.rounds, "steps": self.steps, "mismatches": self.mismatches,
                "chosen_k": {str(k): n for k, n in sorted(self.chosen_k.items())}}


class Bench:
    def __init__(self, target, store, tuners, max_tokens: int):
        self.target, self.store, self.tuners, self.max_tokens = target, store, tuners, max_tokens
        self.runtimes = {}

    def run(self, w: Workload, p: Prompt, config: str, max_tokens: int | None = None):
        if w.transcripts is not None:
            w.transcripts.sync(p.session, p.turn)
        if config not in self.runtimes:  # one runtime per config: its own tuner and ledger
            self.runtimes[config] = Runtime(self.target, self.store, tuner=self.tuners[config])
        return complete_at(p.text, repo=w.scope_dir, proposer=PROPOSER, k=k_of(config),
                           max_tokens=max_tokens or self.max_tokens,
                           runtime=self.runtimes[config], language=LANGUAGE[w.kind])


def make_tuner(work: Path, name: str, key: str, cost: CostModel, seed: int) -> Tuner:
    """A tuner on its own ledger DB, seeded with the shared calibration as ``Tuner.open``
    seeds a fresh store (the points counted as 3 forwards each)."""
    ledger = LedgerStore(HistoryStore(work / f"tuner-{name.replace('=', '')}.db"))
    ledger.add_costs(key, cost.points)
    return Tuner(ledger, key, cost, seed=seed)


def warm_up(bench: Bench, workloads: list[Workload], rounds_goal: int, max_prompts: int,
            max_tokens: int, log) -> dict:
    """k=auto alone on the warm-up prompts, types round-robin, until each type is done."""
    tuner = bench.tuners["auto"]
    state = {w.kind: {"prompts": 0, "rounds": 0, "steps": 0, "tokens": 0, "decode_ms": 0.0,
                      "stopped": None} for w in workloads}
    queues = {w.kind: list(w.warmup) for w in workloads}
    active = [w for w in workloads]
    while active:
        for w in list(active):
            st = state[w.kind]
            choice = tuner.choose(PROPOSER, LANGUAGE[w.kind])
            if st["rounds"] >= rounds_goal:
                st["stopped"] = "rounds"
            elif st["prompts"] > 0 and choice == 0 and st["steps"] >= rounds_goal:
                st["stopped"] = "k=0 steps"
            elif st["prompts"] >= max_prompts:
                st["stopped"] = "max prompts"
            elif not queues[w.kind]:
                st["stopped"] = "out of prompts"
            if st["stopped"]:
                active.remove(w)
                continue
            p = queues[w.kind].pop(0)
            c = bench.run(w, p, "auto", max_tokens)
            led = c.generation.ledger
            st["prompts"] += 1
            st["rounds"] += led.rounds
            st["steps"] += led.rounds + led.plain_steps
            st["tokens"] += led.committed_tokens
            st["decode_ms"] += led.decode_ms
            log(f"warm-up {w.kind:<10} #{st['prompts']:<3} k={c.tuned['k'] if c.tuned else 0:<2}"
                f" rounds {st['rounds']:>4} steps {st['steps']:>4}  {p.name}")
    for w in workloads:
        est = tuner.estimate(PROPOSER, LANGUAGE[w.kind])
        state[w.kind]["tuner_k"] = est.k
        state[w.kind]["tuner_rounds"] = est.rounds  # decayed, as the tuner holds them
        state[w.kind]["tuner_steps"] = est.steps
    return state


def measure(bench: Bench, workloads: list[Workload], log) -> tuple[dict, list[dict]]:
    totals = {w.kind: {c: Totals() for c in CONFIGS} for w in workloads}
    rows = []
    n = max(len(w.measured) for w in workloads)
    i = 0
    for j in range(n):  # types interleaved prompt by prompt
        for w in workloads:
            if j >= len(w.measured):
                continue
            p = w.measured[j]
            order = CONFIGS[i % len(CONFIGS):] + CONFIGS[: i % len(CONFIGS)]
            i += 1
            results, wall_ms = {}, {}
            for config in order:
                t0 = time.perf_counter()
                results[config] = bench.run(w, p, config)
                wall_ms[config] = (time.perf_counter() - t0) * 1000
            plain = results["plain"].generation.tokens
            row = {"type": w.kind, "prompt": p.name, "order": list(order),
                   "prompt_tokens": results["plain"].generation.ledger.prompt_tokens,
                   "configs": {}}
            for config, c in results.items():
                led = c.generation.ledger
                tot = totals[w.kind][config]
                tot.add(led)
                div = first_difference(plain, c.generation.tokens)
                if config != "plain" and div is not None:
                    tot.mismatches += 1
                if c.tuned is not None:
                    tot.chosen_k[c.tuned["k"]] += 1
                row["configs"][config] = {
                    "tokens": led.committed_tokens, "decode_ms": round(led.decode_ms, 2),
                    "rounds": led.rounds, "draft_tokens": led.draft_tokens,
                    "accepted_tokens": led.accepted_tokens, "first_divergence": div,
                    "tuned_k": c.tuned["k"] if c.tuned else None,
                    "prefill_ms": round(led.prefill_ms, 2), "wall_ms": round(wall_ms[config], 2)}
            rows.append(row)
            tps = {c: r["tokens"] / r["decode_ms"] * 1000 if r["decode_ms"] else 0.0
                   for c, r in row["configs"].items()}
            log(f"measure {w.kind:<10} {j + 1}/{len(w.measured)} {p.name}: plain"
                f" {tps['plain']:.0f} tok/s, auto {tps['auto']:.0f} (k="
                f"{row['configs']['auto']['tuned_k']}), best fixed "
                f"{max(tps[f'k={k}'] for k in FIXED_K):.0f}")
    return totals, rows


# ---------------------------------------------------------------- report


def summarize(totals: dict, warm: dict, rounds_goal: int) -> dict:
    out = {"types": {}, "overall": {}, "goals": {}}
    overall = {c: Totals() for c in CONFIGS}
    for kind, per in totals.items():
        for c, t in per.items():
            o = overall[c]
            for name in ("generations", "tokens", "decode_ms", "draft_tokens",
                         "accepted_tokens", "rounds", "steps", "mismatches"):
                setattr(o, name, getattr(o, name) + getattr(t, name))
            o.chosen_k.update(t.chosen_k)
        plain = per["plain"].tokens_per_s
        best_k = max(FIXED_K, key=lambda k: per[f"k={k}"].tokens_per_s)
        best = per[f"k={best_k}"].tokens_per_s
        auto = per["auto"].tokens_per_s
        # Judged once the tuner saw rounds_goal rounds, or as many steps with speculation off.
        judged = warm[kind]["stopped"] in ("rounds", "k=0 steps")
        out["types"][kind] = {
            "configs": {c: t.as_dict() for c, t in per.items()},
            "best_fixed_k": best_k, "auto_vs_plain": auto / plain if plain else None,
            "auto_vs_best_fixed": auto / best if best else None,
            "warmup": warm[kind],
        }
        out["goals"][f"{kind}: auto >= 0.90x best fixed k"] = bool(best and auto >= 0.9 * best)
        out["goals"][f"{kind}: auto >= 0.95x plain"] = (
            bool(plain and auto >= 0.95 * plain) if judged
            else f"not judged: {warm[kind]['rounds']} < {rounds_goal} warm-up rounds,"
            f" stopped by {warm[kind]['stopped']}")
    best_k = max(FIXED_K, key=lambda k: overall[f"k={k}"].tokens_per_s)
    best = overall[f"k={best_k}"].tokens_per_s
    auto = overall["auto"].tokens_per_s
    plain = overall["plain"].tokens_per_s
    out["overall"] = {"configs": {c: t.as_dict() for c, t in overall.items()},
                      "best_fixed_k": best_k, "auto_vs_best_fixed": auto / best if best else None,
                      "auto_vs_plain": auto / plain if plain else None}
    out["goals"]["overall: auto >= 1.2x best global fixed k"] = bool(best and auto >= 1.2 * best)
    return out


def rate(num: float, den: float) -> str:
    return f"{num / den:.2f}" if den else "-"


def print_report(console: Console, summary: dict, rounds_goal: int) -> None:
    warm = Table(title=f"warm-up: k=auto alone until {rounds_goal} rounds per type")
    for col in ("type", "prompts", "rounds", "steps", "tok/s", "tuner k after", "stopped by"):
        warm.add_column(col, justify="right")
    for kind, t in summary["types"].items():
        w = t["warmup"]
        warm.add_row(kind, str(w["prompts"]), str(w["rounds"]), str(w["steps"]),
                     f"{w['tokens'] * 1000 / w['decode_ms']:.1f}" if w["decode_ms"] else "-",
                     str(w["tuner_k"]), str(w["stopped"]))
    console.print(warm)

    table = Table(title="measured: decode tokens/s per file type and config (prefill excluded)")
    for col in ("type", "config", "tok/s", "x plain", "x best fixed", "acceptance",
                "mean acc. len", "coverage", "differs from plain", "k chosen (auto)"):
        table.add_column(col, justify="right")
    sections = list(summary["types"].items()) + [("ALL", summary["overall"])]
    for n, (kind, t) in enumerate(sections):
        plain = t["configs"]["plain"]["tokens_per_s"]
        best_c = f"k={t['best_fixed_k']}"
        best = t["configs"][best_c]["tokens_per_s"]
        for c in CONFIGS:
            d = t["configs"][c]
            tps = d["tokens_per_s"]
            mark = " *" if c == best_c else ""
            table.add_row(
                kind if c == "plain" else "", c + mark, f"{tps:.1f}", rate(tps, plain),
                rate(tps, best) if c == "auto" else "",
                rate(d["accepted_tokens"], d["draft_tokens"]) if d["draft_tokens"] else "-",
                f"{1 + d['accepted_tokens'] / d['rounds']:.2f}" if d["rounds"] else "-",
                rate(d["rounds"], d["steps"]),
                "" if c == "plain" else f"{d['mismatches']}/{d['generations']}",
                " ".join(f"{k}:{v}" for k, v in d["chosen_k"].items()) if c == "auto" else "",
                end_section=(c == CONFIGS[-1] and n < len(sections) - 1))
    console.print(table)
    console.print("* best fixed k of the row group; 'differs from plain': generations whose"
                  " greedy tokens differ (near-ties of batched numerics, docs/design.md, 'Exactness'; counted,"
                  " not failed)")
    for goal, ok in summary["goals"].items():
        flag = "PASS" if ok is True else "FAIL" if ok is False else "n/a "
        style = {"PASS": "green", "FAIL": "red"}.get(flag, "yellow")
        detail = "" if isinstance(ok, bool) else f" ({ok})"
        console.print(f"[{style}]{flag}[/] {goal}{detail}")
    o = summary["overall"]
    f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    console.print(f"overall: auto {o['configs']['auto']['tokens_per_s']:.1f} tok/s ="
                  f" {f(o['auto_vs_best_fixed'])}x the best global fixed k"
                  f" (k={o['best_fixed_k']}), {f(o['auto_vs_plain'])}x plain")


def main():
    global PROPOSER
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="measured prompts per type")
    ap.add_argument("--max-tokens", type=int, default=56, help="new tokens per completion")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--types", default=",".join(TYPES),
                    help=f"comma-separated, of: {', '.join(TYPES)}")
    ap.add_argument("--warmup-rounds", type=int, default=200,
                    help="rounds of each type the auto tuner observes before measuring")
    ap.add_argument("--warmup-max-prompts", type=int, default=40,
                    help="cap on warm-up prompts per type")
    ap.add_argument("--warmup-max-tokens", type=int, default=128,
                    help="new tokens per warm-up completion")
    ap.add_argument("--history-files", type=int, default=40,
                    help="files per type copied into its history scope")
    ap.add_argument("--holdout", action="store_true",
                    help="prompt files from outside the history (default: inside it)")
    ap.add_argument("--fixed-cost", choices=("warmup", "calibration"), default="warmup",
                    help="t(n) the fixed-k tuners start from: the auto tuner's after the"
                    " warm-up, or the calibration alone")
    ap.add_argument("--threads", type=int, default=None,
                    help="Target threads [default: all usable cores]")
    ap.add_argument("--proposer", default=PROPOSER, choices=("suffix", "ngram"),
                    help="the proposer every config drafts with (ngram has no cost cut of"
                         " its own, so its ceiling matters more)")
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    args = ap.parse_args()
    PROPOSER = args.proposer
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    if bad := [t for t in types if t not in TYPES]:
        ap.error(f"unknown type(s) {', '.join(bad)}; known: {', '.join(TYPES)}")
    console = Console(width=150)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()

    target = open_target(None, n_threads=args.threads)
    key = target_key(target)
    t0 = time.perf_counter()
    cost = CostModel.calibrate(target)
    log(f"Target {key}; calibrated t(n) in {time.perf_counter() - t0:.1f} s: "
        + ", ".join(f"t({n})={ms:.1f}" for n, ms in sorted(cost.points.items())) + " ms")
    if cost.t_ms(1) > 3 * BRIEF_CPU_POINTS[1] and str(target.device).startswith("cpu"):
        log(f"warning: t(1) = {cost.t_ms(1):.0f} ms, the reference CPU measured ~{BRIEF_CPU_POINTS[1]:.0f}"
            " ms on 2 idle cores: the CPU is busy (llama.cpp threads wait on each other when"
            " other work holds a core); tokens/s will be noisy. Run on an idle machine, or"
            " pass --threads 1")

    rng = random.Random(args.seed)
    n_warm = args.warmup_max_prompts
    with tempfile.TemporaryDirectory(prefix="assistd-tuner-bench-") as d:
        work = Path(d)
        store = HistoryStore(work / "history.db")
        tuners = {"auto": make_tuner(work, "auto", key, cost, args.seed)}
        workloads = []
        for kind in types:
            t0 = time.perf_counter()
            if kind == "transcript":
                w = transcript_workload(work, rng, args.prompts, n_warm, store, target)
            else:
                w = file_workload(kind, work, rng, args.prompts, n_warm, args.history_files,
                                  args.holdout)
            workloads.append(w)
            log(f"{kind}: history {w.history_docs} documents, {w.history_bytes / 1e6:.2f} MB;"
                f" {len(w.measured)} measured + {len(w.warmup)} warm-up prompts available"
                f" ({time.perf_counter() - t0:.1f} s)")
        bench = Bench(target, store, tuners, args.max_tokens)
        t0 = time.perf_counter()
        warm = warm_up(bench, workloads, args.warmup_rounds, args.warmup_max_prompts,
                       args.warmup_max_tokens, log)
        warm_s = time.perf_counter() - t0
        # In real use every ceiling's generations add to the Target's one cost table in
        # the store, so a fixed-k user's proposer cuts drafts with a t(n) as measured as
        # auto's: the fixed-k (and plain) tuners start from the t(n) the auto tuner holds
        # after the warm-up (calibration + measured forwards), not from the calibration.
        fixed_cost = cost if args.fixed_cost == "calibration" else CostModel(
            dict(tuners["auto"].cost_model().points), source="auto tuner after warm-up")
        for c in CONFIGS[:-1]:
            tuners[c] = make_tuner(work, c, key, fixed_cost, args.seed)
        log("t(n) at the start of the measured pass: " + ", ".join(
            f"t({n})={fixed_cost.t_ms(n):.1f}" for n in (1, 2, 4, 8, 16)) + " ms")
        t0 = time.perf_counter()
        totals, rows = measure(bench, workloads, log)
        measure_s = time.perf_counter() - t0
        store.close()
    summary = summarize(totals, warm, args.warmup_rounds)
    wall = time.perf_counter() - started
    console.print(f"tuner_mixed: {len(types)} types x {args.prompts} prompts x"
                  f" {len(CONFIGS)} configs, {args.max_tokens} new tokens, proposer {PROPOSER},"
                  f" Target {key}; history {'excludes' if args.holdout else 'includes'} the"
                  f" prompt files; wall {wall:.0f} s (warm-up {warm_s:.0f} s, measured"
                  f" {measure_s:.0f} s)")
    print_report(console, summary, args.warmup_rounds)
    if args.json:
        args.json.write_text(json.dumps({
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "target": key, "cost_model": cost.as_dict(), "wall_s": wall,
            "warmup_s": warm_s, "measure_s": measure_s, **summary, "prompts": rows,
        }, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
