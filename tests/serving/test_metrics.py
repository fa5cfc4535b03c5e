"""``GET /metrics`` and the per-response ``metrics`` object, end to end: a real ``assistd
serve`` process with the real embedded model, scraped over its Unix socket and over
loopback TCP, the exposition parsed by ``prometheus_client``'s own parser and held against
the responses' own counts (exact integers: the counters are since the daemon started, not
the tuner's fading ledger) and against ``/v1/assistd/stats`` of the same daemon (that
ledger fades with a half-life of 7 days: under 1e-4 of a token between two reads here).
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.daemon import start_daemon
from storage.store import HistoryStore
from storage.suggestions import Served, SuggestionStore

# A prompt that repeats itself: ngram drafts from it at once (it needs no cost model).
REPEATED = "def f1():\n    return 1\n\ndef f2():\n    return 2\n\n" * 3 + "def f3():\n    return"
MAX_TOKENS = 24
SPEC = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens",
        "spec_decode_num_accepted_tokens")
# /metrics family -> the stats entry's counter and the per-response field it sums
FIELDS = {"spec_decode_num_drafts": ("rounds", "num_spec_steps"),
          "spec_decode_num_draft_tokens": ("draft_tokens", "num_draft_tokens"),
          "spec_decode_num_accepted_tokens": ("accepted_tokens", "num_accepted_draft_tokens")}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """One daemon for the module, on a fresh database, with loopback TCP and a token."""
    d = start_daemon(tmp_path_factory.mktemp("metrics"), tcp=True,
                     env={"ASSISTD_THREADS": "1"})
    yield d
    assert d.stop() == 0


def scrape(client: httpx.Client) -> dict[str, dict]:
    """``/metrics`` parsed: ``{family name without the prefix: {"type", "samples":
    {(sample name, sorted label pairs): value}}}``."""
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for f in text_string_to_metric_families(r.text):
        assert f.name.startswith("assistd:"), f.name
        out[f.name.removeprefix("assistd:")] = {
            "type": f.type,
            "samples": {(s.name, tuple(sorted(s.labels.items()))): s.value
                        for s in f.samples}}
    return out


def series(families: dict, name: str) -> dict[tuple[str, str], float]:
    """A spec-decode family's values by (language, proposer)."""
    return {(dict(labels)["language"], dict(labels)["proposer"]): v
            for (_, labels), v in families[name]["samples"].items()}


def generate(client: httpx.Client, language: str, *, stream: bool = False) -> dict:
    """One ngram completion of REPEATED (k 3) under ``language``; its
    ``metrics.speculative_decoding`` (the last chunk's on a stream)."""
    body = {"model": "assistd", "prompt": REPEATED, "max_tokens": MAX_TOKENS,
            "temperature": 0, "assistd": {"proposer": "ngram", "k": 3, "language": language}}
    if not stream:
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()["metrics"]["speculative_decoding"]
    r = client.post("/v1/completions", json={**body, "stream": True,
                                             "stream_options": {"include_usage": True}})
    assert r.status_code == 200, r.text
    events = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: {")]
    last = events[-1]
    assert last["choices"] == [] and "usage" in last
    assert events[-2]["metrics"] == last["metrics"]  # the finish chunk carries them too
    return last["metrics"]["speculative_decoding"]


def entries(client: httpx.Client) -> tuple[dict[tuple[str, str], dict], dict]:
    """``/v1/assistd/stats``' ledger entries by (language, proposer) (one Target here),
    and the whole answer."""
    r = client.get("/v1/assistd/stats")
    assert r.status_code == 200, r.text
    es = r.json()["ledger"]["entries"]
    assert len({e["target"] for e in es}) <= 1
    return {(e["language"], e["proposer"]): e for e in es}, r.json()


@pytest.mark.local_target("draft rounds are verified here: a remote Target's server drafts")
def test_metrics_match_stats_and_the_responses(daemon):
    """The spec-decode counters equal the sums of the responses' own
    ``speculative_decoding`` counts, per (language, proposer), as exact integers, and the
    stats ledger of the same daemon; the per-position series sum to the accepted tokens;
    all of it grows by the next request's counts; generation tokens equal the daemon's
    ``tokens_generated``."""
    with daemon.uds() as c:
        made = {("python", "ngram"): [generate(c, "python"), generate(c, "python", stream=True)],
                ("go", "ngram"): [generate(c, "go")]}
        first = scrape(c)
        stats, whole = entries(c)
    assert {f: first[f]["type"] for f in SPEC} == dict.fromkeys(SPEC, "counter")
    assert first["generation_tokens"]["type"] == first["prompt_tokens"]["type"] == "counter"
    drafts = series(first, "spec_decode_num_drafts")
    assert drafts[("python", "ngram")] > 0, "ngram drafted nothing from a repeated prompt"
    for family, (counter, field) in FIELDS.items():
        got = series(first, family)
        assert set(got) == set(stats) == set(made)
        for key, value in got.items():
            assert value == sum(m[field] for m in made[key])
            assert value == pytest.approx(stats[key][counter], abs=1e-3)
    # positions 0..: the ledger's accepted_per_position, summing to the accepted tokens
    per_pos = first["spec_decode_num_accepted_tokens_per_pos"]["samples"]
    accepted = series(first, "spec_decode_num_accepted_tokens")
    for key, entry in stats.items():
        mine = {int(dict(lb)["position"]): v for (_, lb), v in per_pos.items()
                if (dict(lb)["language"], dict(lb)["proposer"]) == key}
        assert sorted(mine) == list(range(len(entry["accepted_per_position"])))
        assert [mine[i] for i in sorted(mine)] == pytest.approx(
            entry["accepted_per_position"], abs=1e-3)
        assert sum(mine.values()) == accepted[key]
        hist = sum(j * n for m in made[key] for j, n in enumerate(m["acceptance_histogram"]))
        assert sum(mine.values()) == hist
    tokens = first["generation_tokens"]["samples"][("assistd:generation_tokens_total", ())]
    assert tokens == whole["daemon"]["tokens_generated"] > 0

    with daemon.uds() as c:
        more = generate(c, "python")
        second = scrape(c)
    before = series(first, "spec_decode_num_drafts")
    after = series(second, "spec_decode_num_drafts")
    py, go = ("python", "ngram"), ("go", "ngram")
    assert after[py] == before[py] + more["num_spec_steps"] > before[py]
    assert after[go] == before[go]
    assert second["generation_tokens"]["samples"][("assistd:generation_tokens_total", ())] > tokens
    prompt = ("assistd:prompt_tokens_total", ())
    assert second["prompt_tokens"]["samples"][prompt] > first["prompt_tokens"]["samples"][prompt] > 0


def test_metrics_behind_the_token_on_tcp(daemon):
    """Over TCP ``/metrics`` needs the bearer token (401 without it, or with a wrong one,
    as every route); with it the exposition is the Unix socket's."""
    url = f"http://127.0.0.1:{daemon.port}"
    token = daemon.token_file.read_text().strip()
    with httpx.Client(base_url=url, timeout=60) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = c.get("/metrics", headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert "assistd:" not in r.text
    with httpx.Client(base_url=url, timeout=60,
                      headers={"Authorization": f"Bearer {token}"}) as c:
        over_tcp = scrape(c)
    with daemon.uds() as c:
        over_unix = scrape(c)
    assert set(over_tcp) == set(over_unix) >= {"generation_tokens"}
    assert (over_tcp["generation_tokens"]["samples"]
            == over_unix["generation_tokens"]["samples"])


def test_editor_suggestions(daemon):
    """Suggestion events in the daemon's store (written there by a second connection, as
    an editor's session would through the daemon) appear per language, equal to the
    stats' ``user_acceptance``; outcomes are labelled, shown counts every shown one."""
    store = HistoryStore(daemon.db)
    try:
        s = SuggestionStore(store)
        for i, (lang, outcome) in enumerate([("rust", "accepted"), ("rust", "dismissed"),
                                             ("rust", None), ("lua", "partial")]):
            served = Served(id=f"m{i}", scope=None, path="x", language_id=lang,
                            proposer="ngram", target="t", text="let x = 1;")
            s.event(served, "shown")
            if outcome:
                s.event(served, outcome, accepted_chars=3)
    finally:
        store.close()
    with daemon.uds() as c:
        got = scrape(c)
        ua = c.get("/v1/assistd/stats").json()["user_acceptance"]
    shown = {dict(lb)["language"]: v
             for (_, lb), v in got["editor_suggestions_shown"]["samples"].items()}
    outcome = {(dict(lb)["language"], dict(lb)["outcome"]): v
               for (_, lb), v in got["editor_suggestions_outcome"]["samples"].items()}
    assert shown == {"rust": 3, "lua": 1} == {k: u["shown"] for k, u in ua.items()}
    assert outcome == {(lang, o): ua[lang][o] for lang in ua
                       for o in ("accepted", "partial", "dismissed")}
    assert outcome[("rust", "accepted")] == outcome[("rust", "dismissed")] == 1
    assert outcome[("lua", "partial")] == 1 and outcome[("rust", "partial")] == 0


def test_openai_client_ignores_the_metrics_field(daemon):
    """The openai package parses an answer with the top-level ``metrics`` object and
    keeps it as an extra field; plain decoding's ``speculative_decoding`` is null."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{daemon.port}/v1",
                           api_key=daemon.token_file.read_text().strip(), timeout=300,
                           max_retries=0)
    r = client.chat.completions.create(
        model="assistd", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8,
        temperature=0, extra_body={"assistd": {"proposer": "none"}})
    assert r.choices[0].message.content is not None
    assert r.model_extra["metrics"] == {"speculative_decoding": None}
