"""The engine thread: the only thread that touches the backend. Requests wait in a bounded FIFO queue.

Handlers submit() a Job and read its events; submit() raises QueueFull when max_waiting jobs already wait (the
handler answers 503 with Retry-After). cancel() marks a job: a waiting job leaves the queue at once, a running one
stops at its next cycle. A failing job becomes a JobFailed event (400 for a context overflow, 500 for a backend
failure); after a failure the session is reset, and the thread goes on to the next job.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.errors import ContextOverflowError
from engine.server.generation import Event, GenerationJob, Generator
from engine.server.metrics import ServerMetrics

log = logging.getLogger("engine.server")


class QueueFull(Exception):
    """The queue holds max_waiting jobs; retry_after estimates when to try again (seconds)."""

    def __init__(self, num_waiting: int, retry_after: int):
        self.num_waiting, self.retry_after = num_waiting, retry_after
        super().__init__(f"the server is busy: {num_waiting} requests are already waiting")


@dataclass(slots=True)
class JobFailed:
    """A job that could not finish; status is the HTTP status to answer with."""

    status: int
    message: str
    error_type: str


@dataclass(slots=True, eq=False)  # eq=False: jobs compare by identity (the queue removes this very job)
class Job:
    """One request's work, where its events go, and its cancel flag."""

    work: GenerationJob
    emit: Callable[[Event | JobFailed], None]
    cancelled: threading.Event = field(default_factory=threading.Event)


class EngineWorker:
    """Runs jobs one at a time, in arrival order, on its own thread."""

    def __init__(self, generator: Generator, metrics: ServerMetrics, max_waiting: int = 16):
        if max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {max_waiting}")
        self.generator, self.metrics, self.max_waiting = generator, metrics, max_waiting
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._is_stopping = False
        self._current: Job | None = None  # the running job
        self._mean_job_s = 5.0  # decayed mean job duration, for Retry-After
        self._thread = threading.Thread(target=self._loop, name="openjet-engine", daemon=True)

    def start(self) -> None:
        """Start the engine thread."""
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every job and end the thread (the running job stops at its next cycle)."""
        with self._cond:
            self._is_stopping = True
            for job in [*self._queue, *([self._current] if self._current is not None else [])]:
                job.cancelled.set()
            self._queue.clear()
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def num_waiting(self) -> int:
        """Jobs waiting (not counting the running one)."""
        with self._cond:
            return len(self._queue)

    def submit(self, job: Job) -> None:
        """Queue a job; QueueFull when max_waiting jobs already wait."""
        with self._cond:
            if self._is_stopping:
                raise QueueFull(len(self._queue), 1)
            if len(self._queue) >= self.max_waiting:
                self.metrics.requests.labels("rejected").inc()
                retry = math.ceil(self._mean_job_s * (len(self._queue) + 1))
                raise QueueFull(len(self._queue), max(1, min(retry, 600)))
            self._queue.append(job)
            self.metrics.waiting.set(len(self._queue))
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """Stop a job: out of the queue if it waits, at the next cycle if it runs."""
        job.cancelled.set()
        with self._cond:
            if job in self._queue:
                self._queue.remove(job)
                self.metrics.waiting.set(len(self._queue))
                self.metrics.requests.labels("cancelled").inc()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._is_stopping:
                    self._cond.wait()
                if self._is_stopping:
                    return
                job = self._current = self._queue.popleft()
                self.metrics.waiting.set(len(self._queue))
            self.metrics.running.set(1)
            started = time.perf_counter()
            try:
                self._run(job)
            finally:
                with self._cond:
                    self._current = None
                self.metrics.running.set(0)
                self._mean_job_s = 0.8 * self._mean_job_s + 0.2 * (time.perf_counter() - started)

    def _run(self, job: Job) -> None:
        try:
            finished = self.generator.run(job.work, job.emit, job.cancelled.is_set)
        except ContextOverflowError as exc:
            self.metrics.requests.labels("error").inc()
            job.emit(JobFailed(400, str(exc), "invalid_request_error"))
        except Exception as exc:  # a backend failure: answer 500, reset, serve the next request
            log.exception("generation failed")
            self.metrics.requests.labels("error").inc()
            self._reset_after_failure()
            job.emit(JobFailed(500, f"the engine failed: {type(exc).__name__}: {exc}", "server_error"))
        else:
            self.metrics.observe(finished)
            controller = self.generator.decoder.controller
            if controller is not None:
                self.metrics.draft_length.set(controller.last_choice)

    def _reset_after_failure(self) -> None:
        try:
            self.generator.session.invalidate()
        except Exception:  # a backend too broken to reset fails the next request the same way, with a 500
            log.exception("resetting the backend after a failure failed too")
