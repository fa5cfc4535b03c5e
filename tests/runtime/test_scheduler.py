"""The engine scheduler: priority classes, FIFO within a class, preemption between rounds."""

from __future__ import annotations

import threading

import pytest

from assistd.runtime.scheduler import AGENT, EDITOR, SHELL, Scheduler


@pytest.fixture
def sched():
    s = Scheduler()
    s.start()
    yield s
    s.stop()


def _blocked(sched, gate: threading.Event, started: threading.Event):
    """Occupy the thread until ``gate`` is set, so that what follows queues up."""
    def job():
        started.set()
        gate.wait(10)
    return sched.submit(job, AGENT, "blocker")


def test_priority_order_then_arrival(sched):
    """Queued jobs run editor first, then shell, then agent, and in arrival order within a
    priority."""
    gate, started, order = threading.Event(), threading.Event(), []
    _blocked(sched, gate, started)
    started.wait(5)
    futs = [sched.submit(lambda n=n: order.append(n), p, n) for n, p in
            [("agent1", AGENT), ("shell1", SHELL), ("editor1", EDITOR), ("agent2", AGENT),
             ("editor2", EDITOR)]]
    assert [q["name"] for q in sched.queued()] == ["editor1", "editor2", "shell1", "agent1",
                                                   "agent2"]
    gate.set()
    for f in futs:
        f.result(5)
    assert order == ["editor1", "editor2", "shell1", "agent1", "agent2"]


def test_preempt_runs_only_more_urgent_jobs_on_the_same_thread(sched):
    """preempt() inside a shell job runs only the more urgent editor job, on the engine thread,
    while the job stays running; the agent job waits its turn; one preemption is counted."""
    seen = []

    def long_job():
        threads = {threading.get_ident()}
        sched.submit(lambda: seen.append(("agent", threading.get_ident())), AGENT, "a")
        sched.submit(lambda: seen.append(("editor", threading.get_ident())), EDITOR, "e")
        ran = sched.preempt()  # between two rounds
        return ran, threads, sched.running()

    ran, threads, running = sched.submit(long_job, SHELL, "long").result(5)
    assert ran is True
    assert seen[0][0] == "editor" and seen[0][1] in threads  # ran inside, on the engine thread
    assert running == ["long"]
    sched.submit(lambda: None, AGENT).result(5)
    assert [s for s, _ in seen] == ["editor", "agent"]  # the agent job waited its turn
    assert sched.stats.preemptions == 1


def test_errors_reach_the_caller_and_cancelled_jobs_are_skipped(sched):
    """A job's exception reaches its future's caller and is counted failed; a job cancelled
    while queued never runs."""
    gate, started, ran = threading.Event(), threading.Event(), []
    _blocked(sched, gate, started)
    started.wait(5)
    doomed = sched.submit(lambda: ran.append("doomed"), AGENT)
    assert doomed.cancel()
    bad = sched.submit(lambda: 1 / 0, AGENT)
    gate.set()
    with pytest.raises(ZeroDivisionError):
        bad.result(5)
    assert ran == [] and sched.stats.failed == 1


def test_stop_cancels_what_is_queued_and_refuses_new_work():
    """stop() cancels jobs still queued and submit() afterwards raises RuntimeError ('shutting
    down')."""
    s = Scheduler()
    s.start()
    gate, started = threading.Event(), threading.Event()
    _blocked(s, gate, started)
    started.wait(5)
    queued = s.submit(lambda: "never", AGENT)
    threading.Timer(0.2, gate.set).start()
    s.stop()
    assert queued.cancelled()
    with pytest.raises(RuntimeError, match="shutting down"):
        s.submit(lambda: None)
