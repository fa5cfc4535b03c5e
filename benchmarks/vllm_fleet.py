"""A replayed fleet in vLLM: N agents' requests drafted from one shared history against
a history per server, with assistd's proposer inside vLLM's CPU build (one request at a
time on this machine; the replay's version, without vLLM: benchmarks/fleet.py).

    .venv/bin/python benchmarks/vllm_fleet.py [--agents 3] [--requests 4] [--k 8]
        [--max-tokens 96] [--json OUT]

The shared transcripts (read in place, the README's replay set) are split among N agents
by session, round-robin (benchmarks/fleet.py's ``split_streams``); an agent's stream is
its sessions' turns in order. Each agent sends R requests, spread evenly over its stream:
a request's prompt is the 3,500 characters of the stream before a line start, and it
asks for 96 greedy tokens. The fleet runs in rounds: round j is agent 0's j-th request,
then agent 1's, and so on.

Arms (each at the same ``num_speculative_tokens``):

- ``ngram``: vLLM's prompt lookup (2-4): no history, the same whatever the fleet's layout;
- ``silo``: a history per server: one vLLM per agent, serving only that agent's requests,
  its history holding only that agent's stream so far (N servers);
- ``shared``: one vLLM and one history for all: before each request the history holds
  every agent's stream up to that agent's latest request (the requests already sent).

All servers are started first; then the fleet's requests go out one at a time, each to
every arm in turn (the order rotated), so that the arms meet the same moments of this
shared 2-core machine. A history holds only text written before each request, never the
continuation measured.
Per arm: output tokens/s over all requests, accepted draft tokens per output token, and
greedy outputs equal to ``ngram``'s (vLLM without speculation decodes the same: see
benchmarks/vllm_proposers.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fleet import DEFAULT_DIRS, TRANSCRIPTS, split_streams  # noqa: E402
from vllm_proposers import CHUNK_CHARS, Arm  # noqa: E402

from harness import vllm_server  # noqa: E402


def streams(agents: int) -> list[str]:
    """Each agent's text: its sessions' turns, in order (sessions round-robin)."""
    from assistd.measure.replay_inputs import InputReport, transcript_sessions

    paths = [TRANSCRIPTS / d for d in DEFAULT_DIRS if (TRANSCRIPTS / d).exists()]
    sessions = transcript_sessions(paths, InputReport())
    return ["\n\n".join(t.text for si in stream for t in sessions[si].turns)
            for stream in split_streams(len(sessions), agents)]


def request_ends(text: str, requests: int) -> list[int]:
    """``requests`` prompt ends spread evenly over ``text``, each at a line start with at
    least :data:`CHUNK_CHARS` before it."""
    ends = []
    for j in range(requests):
        end = max((j + 1) * len(text) // (requests + 1), CHUNK_CHARS + 1)
        ends.append(text.rfind("\n", 0, end) + 1)
    return ends


def fleet_cases(texts: list[str], requests: int) -> tuple[list[dict], list[list[dict]]]:
    """The shared arm's cases in fleet order, and each agent's silo cases.

    Shared history before agent a's j-th request: agent b's stream up to its j-th
    request's end if b <= a (sent this round), else up to its (j-1)-th (last round)."""
    ends = [request_ends(t, requests) for t in texts]
    shared, silos = [], [[] for _ in texts]
    for j in range(requests):
        for a, text in enumerate(texts):
            end = ends[a][j]
            case = {"name": f"agent{a}@{end}", "prompt": text[end - CHUNK_CHARS:end]}
            silos[a].append({**case, "history": {f"agent{a}.md": text[:end]}})
            history = {}
            for b, other in enumerate(texts):
                upto = ends[b][j] if b <= a else (ends[b][j - 1] if j else 0)
                if upto:
                    history[f"agent{b}.md"] = other[:upto]
            shared.append({**case, "history": history})
    return shared, silos


def totals(rows: list[dict]) -> dict:
    tokens = sum(r["tokens"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    accepted = sum(r["accepted_tokens"] for r in rows)
    return {"requests": len(rows), "tokens": tokens, "tokens_per_s": round(tokens / seconds, 2),
            "accepted_per_output": round(accepted / tokens, 3) if tokens else None,
            "acceptance_rate": round(accepted / d, 3) if (d := sum(r["draft_tokens"]
                                                                    for r in rows)) else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=3,
                        help="agents N (1 to the 13 sessions): silo starts a server per agent")
    parser.add_argument("--requests", type=int, default=4, help="requests per agent")
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens of every arm")
    parser.add_argument("--max-tokens", type=int, default=96, help="tokens per request")
    parser.add_argument("--arms", nargs="+", default=["ngram", "silo", "shared"],
                        choices=["ngram", "silo", "shared"])
    parser.add_argument("--json", type=Path, help="write the rows and the table here")
    args = parser.parse_args()
    if args.requests < 1 or args.k < 1 or args.max_tokens < 1:
        parser.error("--requests, --k and --max-tokens must be at least 1")
    if not TRANSCRIPTS.is_dir():
        parser.error(f"the shared transcripts are not at {TRANSCRIPTS} (read in place)")
    try:
        shared, silos = fleet_cases(streams(args.agents), args.requests)
    except ValueError as e:
        parser.error(str(e))
    if vllm_server.python() is None:
        sys.exit(f"vLLM is not installed: {vllm_server.INSTALL_HINT}")
    vllm_server.model_dir()
    tmp = Path(tempfile.mkdtemp(prefix="vllm-fleet-"))
    servers: dict[str, list[Arm]] = {}
    if "ngram" in args.arms:
        servers["ngram"] = [Arm("ngram", args.k, tmp / "ngram")]
    if "silo" in args.arms:  # a server per agent
        servers["silo"] = [Arm("assistd", args.k, tmp / f"silo{a}") for a in range(args.agents)]
    if "shared" in args.arms:
        servers["shared"] = [Arm("assistd", args.k, tmp / "shared")]
    rows: dict[str, list[dict]] = {arm: [] for arm in servers}
    try:
        for arm, arms in servers.items():
            for a in arms:
                if not a.start():
                    sys.exit(f"{arm}: {a.error['error']}\n{a.error['log']}")
        # Fleet order; the arms take turns request by request (rotated), as in
        # benchmarks/vllm_proposers.py, so that they meet the same moments of the machine.
        names = list(servers)
        for i, case in enumerate(shared):
            agent = int(case["name"].removeprefix("agent").partition("@")[0])
            for arm in names[i % len(names):] + names[:i % len(names)]:
                if arm == "silo":
                    silo_case = silos[agent][i // args.agents]
                    rows[arm].append(servers[arm][agent].request(silo_case, args.max_tokens))
                else:
                    rows[arm].append(servers[arm][0].request(case, args.max_tokens))
        propose = {arm: [a.propose_stats() for a in arms] for arm, arms in servers.items()}
    finally:
        for arms in servers.values():
            for a in arms:
                a.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    base = rows.get("ngram")
    report = {"agents": args.agents, "requests": args.requests, "k": args.k,
              "max_tokens": args.max_tokens, "arms": {}}
    for arm, rs in rows.items():
        t = totals(rs)
        if base:
            t["x_ngram"] = round(t["tokens_per_s"] / totals(base)["tokens_per_s"], 3)
            t["equal_to_ngram"] = sum(a["text"] == b["text"] for a, b in zip(rs, base))
        if any(propose.get(arm, [])):  # per server: its propose() ms per step
            t["propose_ms"] = [p["propose_ms"] for p in propose[arm] if p]
        report["arms"][arm] = t
    if args.json:
        args.json.write_text(json.dumps({**report, "rows": rows}, indent=1))
    print(f"\nvLLM {vllm_server.VLLM_VERSION}, {args.agents} agents x {args.requests} requests,"
          f" k {args.k}, {args.max_tokens} tokens each")
    print("| arm | tokens/s | x ngram | accepted / output | acceptance rate | equal to ngram |"
          " propose ms/step p50 (max), per server |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for arm, t in report["arms"].items():
        ms = ", ".join(f"{p['p50']} ({p['max']})" for p in t.get("propose_ms", []))
        print(f"| {arm} | {t['tokens_per_s']} | {t.get('x_ngram', '')} |"
              f" {t['accepted_per_output']} | {t['acceptance_rate']} |"
              f" {t.get('equal_to_ngram', '')}/{t['requests']} |"
              f" {ms} |")


if __name__ == "__main__":
    main()
