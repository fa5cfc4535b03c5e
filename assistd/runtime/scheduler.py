"""One thread owns the Target: jobs queue by priority, and a running generation lets a
more urgent job run between its rounds.

The Target, its KV cache, the engine's SQLite connection and the history index are
not thread-safe, and there is one Target: every job that touches them runs on the
scheduler's thread. Jobs are ordered by priority class, then arrival (FIFO within a
class: fair among agents, and a burst of agent requests cannot push an editor
request back). A long generation polls :meth:`Scheduler.preempt` before every round
(``generate(between_rounds=...)``); if a job of a more urgent class is waiting, it
runs right there, on the same thread, and the generation then restores its KV cache
(prefix reuse) and goes on. An editor request thus waits at most one round of an
agent generation, never the whole generation (vLLM's scheduler preempts by
recomputation the same way; here the recompute is the suffix the other job evicted).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field

log = logging.getLogger("assistd.scheduler")

# Priority classes: lower runs first.
EDITOR = 0  # an LSP keystroke: someone is waiting with the cursor still
SHELL = 1  # `assistd complete`, MCP tools: a person or agent waiting on one answer
AGENT = 2  # the local API: long agent generations
PRIORITIES = {"editor": EDITOR, "shell": SHELL, "agent": AGENT}


@dataclass(order=True)
class _Job:
    priority: int
    seq: int
    fn: Callable[[], object] = field(compare=False)
    future: Future = field(compare=False)
    name: str = field(compare=False, default="")
    queued: float = field(compare=False, default=0.0)


@dataclass
class SchedulerStats:
    """Counters for ``/v1/assistd/stats`` and ``assistd status``."""

    submitted: int = 0
    completed: int = 0
    failed: int = 0
    preemptions: int = 0  # jobs run between the rounds of a less urgent one
    by_name: dict[str, int] = field(default_factory=dict)  # submitted jobs per name
    queue_ms_total: float = 0.0
    queue_ms_max: float = 0.0


class Scheduler:
    """A priority queue drained by one worker thread (:meth:`start`).

    ``submit(fn, priority)`` returns a :class:`concurrent.futures.Future` with
    ``fn()``'s result or exception. A cancelled future's job is skipped.
    """

    def __init__(self, name: str = "assistd-engine"):
        self._heap: list[_Job] = []
        self._cv = threading.Condition()
        self._seq = itertools.count()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._running: list[_Job] = []  # the stack of jobs on the thread (preemption nests)
        self.stats = SchedulerStats()

    def start(self) -> None:
        self._thread.start()

    def submit(self, fn: Callable[[], object], priority: int = AGENT, name: str = "") -> Future:
        fut: Future = Future()
        with self._cv:
            if self._stopping:
                raise RuntimeError("the engine is shutting down")
            heapq.heappush(self._heap, _Job(priority, next(self._seq), fn, fut, name,
                                            time.monotonic()))
            self.stats.submitted += 1
            self.stats.by_name[name] = self.stats.by_name.get(name, 0) + 1
            self._cv.notify()
        return fut

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def executor(self, priority: int, name: str = "") -> Executor:
        """This scheduler as a :class:`concurrent.futures.Executor` whose jobs run at
        ``priority`` (``loop.run_in_executor`` takes it): a front end written for a
        worker thread of its own runs on the engine thread unchanged."""
        return _PriorityExecutor(self, priority, name)

    def preempt(self) -> bool:
        """Run every queued job more urgent than the running one, here and now.

        Called by the running job between rounds, on the scheduler's thread. Returns
        True when some job ran (the Target's KV cache may have changed)."""
        if not self._running:
            return False
        ran = False
        while True:
            with self._cv:
                current = self._running[-1].priority
                if not self._heap or self._heap[0].priority >= current:
                    return ran
                job = heapq.heappop(self._heap)
            self.stats.preemptions += 1
            self._execute(job)
            ran = True

    def queued(self) -> list[dict]:
        """What is waiting, most urgent first (for ``assistd status``)."""
        now = time.monotonic()
        with self._cv:
            jobs = sorted(self._heap)
        return [{"name": j.name, "priority": j.priority, "waiting_s": round(now - j.queued, 3)}
                for j in jobs]

    def running(self) -> list[str]:
        return [j.name for j in list(self._running)]

    def stop(self, timeout: float | None = 30) -> None:
        """Finish the job in hand, fail the queued ones, join the thread."""
        with self._cv:
            self._stopping = True
            pending, self._heap = self._heap, []
            self._cv.notify_all()
        for job in pending:
            job.future.cancel()
        if self._thread.is_alive() and not self.on_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap and not self._stopping:
                    self._cv.wait()
                if self._stopping and not self._heap:
                    return
                job = heapq.heappop(self._heap)
            self._execute(job)

    def _execute(self, job: _Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            return
        waited = (time.monotonic() - job.queued) * 1000
        self.stats.queue_ms_total += waited
        self.stats.queue_ms_max = max(self.stats.queue_ms_max, waited)
        self._running.append(job)
        try:
            result = job.fn()
        except BaseException as e:  # noqa: BLE001 - delivered to the waiting caller
            self.stats.failed += 1
            job.future.set_exception(e)
        else:
            self.stats.completed += 1
            job.future.set_result(result)
        finally:
            self._running.pop()


class _PriorityExecutor(Executor):
    def __init__(self, scheduler: Scheduler, priority: int, name: str):
        self.scheduler, self.priority, self.name = scheduler, priority, name

    def submit(self, fn, /, *args, **kwargs) -> Future:
        return self.scheduler.submit(lambda: fn(*args, **kwargs), self.priority,
                                     f"{self.name}:{getattr(fn, '__name__', 'job')}")

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass  # the scheduler outlives its executors: Scheduler.stop ends it
