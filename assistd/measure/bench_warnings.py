"""Signs that a bench report's figures are not to be trusted (the machine's speed moved
under the run), for ``assistd bench`` (:mod:`assistd.measure.bench`): the report's
``warnings``."""

from __future__ import annotations


DRIFT = 1.25  # an arm that did plain's work (no round) must run within this factor of it
FALLING_T = 1.1  # t(n) measured over this factor below a smaller n's: not noise
SLOW_T1_MS = 100.0  # a one-token forward of a model this tool embeds takes ~11 ms here


def drift_warnings(report: dict) -> list[str]:
    """Signs that the machine's speed changed under the run, so its ratios are not to be
    trusted: an arm that drafted nothing (the same work as plain) running more than
    ``DRIFT`` times faster or slower than plain, the baseline's speed moving by more than
    ``DRIFT`` between repeats (the same prompts each time) or plain's moving that far from
    the baseline's, a workload's measured t(n) falling by more than ``FALLING_T`` from one
    size to the next (its ceiling rests on it), a calibration that found the
    machine busy, or a calibrated t(1) over ``SLOW_T1_MS`` (another process holding the
    cores)."""
    out = []
    t1 = (report.get("cost_model") or {}).get("points", {}).get("1")
    note = (report.get("cost_model") or {}).get("note", "")
    if note.startswith("busy machine"):  # the calibration itself saw the cores taken
        out.append(f"calibration: {note}; rounds of several tokens may cost many plain "
                   "steps, so the speedups are not this Target's: rerun on idle cores, or "
                   "with --threads 1")
    if t1 is not None and t1 > SLOW_T1_MS:
        out.append(f"calibration measured t(1) = {t1:.0f} ms for one token: the machine was "
                   "busy; rerun on idle cores")
    for w in report["workloads"]:
        base = next((a for a in w["arms"] if a["arm"] == w.get("baseline")), None)
        speeds = [x for x in (base or {}).get("tokens_per_s_per_repeat", []) if x]
        if speeds and max(speeds) > DRIFT * min(speeds):
            # every repeat runs the same cases: the baseline's own speed should not move
            out.append(f"{w['name']}: the baseline ran at {min(speeds):.0f} to "
                       f"{max(speeds):.0f} tokens/s across repeats of the same prompts: the "
                       "machine's speed drifted during the run, so this workload's speedups "
                       "and ceilings are not to be trusted; rerun on idle cores")
        plain = next((a for a in w["arms"] if a["arm"] == "plain"), None)
        if (plain is not None and base is not None and plain is not base
                and plain.get("speedup") and not 1 / DRIFT <= plain["speedup"] <= DRIFT):
            # one-token steps run the same kernels in the main process and the baseline's
            out.append(f"{w['name']}: plain ran at {plain['speedup']:.2f}x the baseline, which "
                       "runs the same one-token kernels: the machine's speed drifted during "
                       "the run; rerun on idle cores")
        t = sorted((int(n), ms) for n, ms in (w.get("t_ms") or {}).items())
        for (a, x), (b, y) in zip(t, t[1:]):
            if y < x / FALLING_T:
                out.append(f"{w['name']}: t({b}) = {y:.1f} ms < t({a}) = {x:.1f} ms: a forward "
                           "over more tokens measured faster, so the machine's speed moved; "
                           "the ceiling built on this t(n) is not to be trusted")
                break
        for a in w["arms"]:
            vs = a.get("speedup_vs_plain", a["speedup"])
            if a["kind"] == "plain" or a["rounds"] != 0 or vs is None:
                continue
            if not 1 / DRIFT <= vs <= DRIFT:
                out.append(f"{w['name']}: {a['arm']} drafted nothing (plain decoding's work) "
                           f"but ran at {vs:.2f}x plain: the machine's speed "
                           "drifted during the run; rerun on idle cores, or with more --repeats")
    return out
