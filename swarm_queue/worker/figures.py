"""What one drain loop counts: prompts finished per job with a recent rate, and in all, for
``swarm-status``, the fleet registry and the worker's last log lines."""

from __future__ import annotations

from collections import deque

from swarm_queue.common.fleet import EndpointInfo, EndpointStats

__all__ = ["RATE_SPAN_S", "EndpointFigures", "JobCount"]


# The span (s) over which the published per-endpoint rate is measured.
RATE_SPAN_S = 10.0


class JobCount:
    """One drainer's prompts finished for one job, with recent samples for a rate."""

    __slots__ = ("done", "failed", "model", "samples")

    def __init__(self, start: float) -> None:
        self.done = 0
        self.failed = 0
        self.model = ""  # the model last asked for the job's prompts
        self.samples: deque[tuple[float, int]] = deque([(start, 0)])

    def rate(self, now: float) -> float:
        """Prompts per second over the last :data:`RATE_SPAN_S` (sampled at each publish)."""
        self.samples.append((now, self.done + self.failed))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_SPAN_S:
            self.samples.popleft()
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


class EndpointFigures:
    """One endpoint's drain loop in figures: prompts finished (per job and in all), prompts
    preempted and dead-lettered, and the rows it publishes."""

    def __init__(self, endpoint: str, worker: str, period_s: float) -> None:
        self.endpoint, self.worker, self.period_s = endpoint, worker, period_s
        self.prompts_done = 0
        self.prompts_failed = 0
        # Prompts whose batch was cancelled for a more urgent job's, released to run again.
        self.preempted = 0
        # Agents' turns handed on from a busy engine to the open lane, for an idle one.
        self.handed_on = 0
        self.dead_lettered = 0
        # Prompts sent as speculative copies at a job's tail, and those whose copy won.
        self.copied = 0
        self.copies_won = 0
        self._jobs: dict[str, JobCount] = {}

    def job(self, job: str, now: float) -> JobCount:
        """The job's count, started at ``now`` (monotonic) the first time: its rate counts
        from its first batch."""
        count = self._jobs.get(job)
        if count is None:
            count = self._jobs[job] = JobCount(now)
        return count

    def count(self, job: str, done: int, failed: int, now: float) -> None:
        """New results committed for ``job``."""
        self.prompts_done += done
        self.prompts_failed += failed
        count = self.job(job, now)
        count.done += done
        count.failed += failed

    def info(self, models: tuple[str, ...], circuit: str, now: float) -> EndpointInfo:
        """The endpoint's row in the fleet registry."""
        return EndpointInfo(
            endpoint=self.endpoint,
            worker=self.worker,
            models=models,
            circuit=circuit,
            updated_s=now,
            period_s=self.period_s,
        )

    def stats(
        self,
        job: str,
        now: float,
        mono: float,
        *,
        circuit: str,
        errors: int,
        last_error: str,
        window: int,
        in_flight: int,
        last: bool,
    ) -> EndpointStats:
        """The endpoint's row for ``job`` (see :class:`EndpointStats`); ``last``: a last word
        (the worker no longer serves the job): no rate, nothing in flight."""
        count = self.job(job, mono)
        return EndpointStats(
            endpoint=self.endpoint,
            worker=self.worker,
            circuit=circuit,
            done=count.done,
            failed=count.failed,
            errors=errors,
            last_error=last_error,
            rate_per_s=0.0 if last else count.rate(mono),
            window=window,
            in_flight=0 if last else in_flight,
            updated_s=now,
            period_s=self.period_s,
            model=count.model,
        )
