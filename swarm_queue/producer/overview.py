"""What the dashboard shows, read from Redis in one pass: every job and every endpoint of the
fleet, and the throughput history the dashboard keeps of them between passes."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import msgspec

from swarm_queue.common.errors import BadRecordError, JobNotFoundError
from swarm_queue.common.fleet import EndpointInfo, EndpointStats, waiting_reason
from swarm_queue.common.keys import stage_name
from swarm_queue.common.models import JobSpec
from swarm_queue.common.redisurl import mask_url
from swarm_queue.common.store import JobStatus, JobStore, OutcomeCounts
from swarm_queue.flows.agents.spec import agent_of
from swarm_queue.flows.steps import over, step_statuses

__all__ = [
    "AgentCounts",
    "EndpointRow",
    "History",
    "JobRow",
    "Overview",
    "StepFigures",
    "job_list",
    "job_state",
    "read_fleet",
    "read_jobs",
    "read_overview",
    "reduce_where",
    "waiting_step",
    "whole_state",
]


class AgentCounts(msgspec.Struct, frozen=True):
    """An agent job's agents by state, as the page shows them: ``thinking`` (a turn queued or
    at an endpoint), ``waiting`` for a tool (in no queue, holding no slot), ``done``."""

    thinking: int
    waiting: int
    done: int

    @classmethod
    def of(cls, counts: OutcomeCounts) -> AgentCounts:
        return cls(counts.active, counts.parked, counts.done)


class StepFigures(msgspec.Struct, frozen=True, array_like=True):
    """One later step of a pipeline: answered, failed, and its total (None: still fed)."""

    done: int
    failed: int
    total: int | None


class JobRow(msgspec.Struct, frozen=True, kw_only=True):
    """One job as the dashboard shows it; ``recent_rate_per_s``: over the last minute, from
    the dashboard's own samples (None until it has two)."""

    job: str
    state: str
    model: str | None = None
    total: int | None = None
    enqueued: int = 0
    done: int = 0
    failed: int = 0
    failed_by_kind: dict[str, int] = msgspec.field(default_factory=dict)
    cache_hits: int = 0
    in_flight: int = 0
    pending: int = 0
    rate_per_s: float = 0.0
    recent_rate_per_s: float | None = None
    eta_s: float | None = None
    reduce: str | None = None
    reduce_level: str = ""
    stage: int = 0
    reduced: bool = False
    waiting: str | None = None
    age_s: float | None = None
    error: str | None = None
    # An agent job's agents by state (None: not an agent job).
    agents: AgentCounts | None = None
    # A pipeline's later steps, in order: each step's answered, failed and total (None: not
    # yet known) so far.
    steps: list[StepFigures] | None = None

    @property
    def live(self) -> bool:
        """Still worked on: its prompts, or its reduce."""
        if self.state in ("running", "waiting"):
            return True
        return self.state == "finished" and self.reduce is not None and not self.reduced


class EndpointRow(msgspec.Struct, frozen=True, kw_only=True):
    """One endpoint of one worker, its figures summed over the jobs it serves now;
    ``throughput``: its rate (prompts/s) at each of the board's ``times``."""

    endpoint: str
    worker: str
    circuit: str
    models: tuple[str, ...] = ()
    done: int = 0
    failed: int = 0
    errors: int = 0
    rate_per_s: float = 0.0
    in_flight: int = 0
    window: int = 0
    seen_s: float | None = None
    last_error: str = ""
    throughput: list[float] = msgspec.field(default_factory=list)


class Overview(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the page draws; ``times``: how long before ``generated_s`` each throughput
    point was read; ``error``: why Redis could not be read (the last board read is kept);
    ``notes``: what was skipped as unreadable."""

    generated_s: float
    redis: str
    prefix: str
    jobs: list[JobRow]
    endpoints: list[EndpointRow]
    times: list[float] = msgspec.field(default_factory=list)
    error: str | None = None
    # Records skipped as unreadable (another tool's keys under swarm-queue's names), and why.
    notes: list[str] = msgspec.field(default_factory=list)
    # The agents' tool calls of this Redis (runs, shared, queued), when an agent job is shown.
    tool_calls: dict[str, int] = msgspec.field(default_factory=dict)


def job_state(s: JobStatus, waiting: str | None = None) -> str:
    """``cancelled``, ``finished``, ``waiting`` (no live endpoint can serve it) or ``running``."""
    if s.cancelled:
        return "cancelled"
    if s.finished:
        return "finished"
    return "waiting" if waiting else "running"


def waiting_step(
    spec: JobSpec,
    status: JobStatus,
    steps: list[tuple[JobSpec, JobStatus]],
    fleet: Sequence[EndpointInfo],
    now: float,
) -> str | None:
    """Why the first step of the job not yet over cannot run (no live endpoint serves its
    model), naming a later step; None when it can."""
    for k, (s, st) in enumerate([(spec, status), *steps]):
        if st.finished or st.cancelled:
            continue
        why = waiting_reason(s.model, fleet, now)
        if why is None:
            return None
        return why if k == 0 else f"step {k} {s.job}: {why}"
    return None


def whole_state(finished: bool, cancelled: bool, waiting: str | None) -> str:
    """A job's state as a whole, its later steps included (see :func:`flows.steps.over`)."""
    if cancelled:
        return "cancelled"
    if finished:
        return "finished"
    return "waiting" if waiting else "running"


def reduce_where(s: JobStatus, stage: JobStatus | None) -> str:
    """Where a job's reduce stands: finished, cancelled, the tree level running (``stage``:
    that level's status), or waiting for the job's own prompts."""
    if s.reduced:
        return "finished: swarm-collect JOB --final"
    if s.cancelled:
        return "cancelled"
    if stage is not None:
        return (
            f"level {s.stage}: {stage.done + stage.failed} of {stage.total or '?'} "
            "supervisor prompts answered"
        )
    return "waiting for every prompt to be answered"


def _job_row(
    s: JobStatus,
    stage: JobStatus | None,
    model: str | None,
    waiting: str | None,
    age_s: float | None,
    state: str,
) -> JobRow:
    eta = None
    if state in ("running", "waiting") and s.total is not None and s.rate_per_s > 0:
        eta = (s.total - s.done - s.failed) / s.rate_per_s
    return JobRow(
        job=s.job,
        state=state,
        model=model,
        total=s.total,
        enqueued=s.enqueued,
        done=s.done,
        failed=s.failed,
        failed_by_kind=dict(s.failed_by_kind),
        cache_hits=s.cache_hits,
        in_flight=s.in_flight,
        pending=s.pending,
        rate_per_s=s.rate_per_s,
        eta_s=eta,
        reduce=s.reduce,
        reduce_level=reduce_where(s, stage) if s.reduce is not None else "",
        stage=s.stage,
        reduced=s.reduced,
        waiting=waiting if state == "waiting" else None,
        age_s=age_s,
    )


def _key(worker: str, endpoint: str) -> str:
    return f"{worker}|{endpoint}"


def _endpoint_rows(
    fleet: Sequence[EndpointInfo], stats: Iterable[EndpointStats], now: float
) -> list[EndpointRow]:
    """One row per worker and endpoint: the fleet registry's circuit and models, the live jobs'
    figures summed (the window and error count are the endpoint's own, shared by its jobs)."""
    rows: dict[str, EndpointRow] = {}
    for info in fleet:
        rows[_key(info.worker, info.endpoint)] = EndpointRow(
            endpoint=mask_url(info.endpoint),
            worker=info.worker,
            circuit=info.circuit if info.live(now) else "silent",
            models=info.models,
            seen_s=max(0.0, now - info.updated_s),
        )
    latest: dict[str, float] = {}
    for st in stats:
        key = _key(st.worker, st.endpoint)
        row = rows.get(key) or EndpointRow(
            endpoint=mask_url(st.endpoint), worker=st.worker, circuit=st.circuit
        )
        row = msgspec.structs.replace(
            row,
            done=row.done + st.done,
            failed=row.failed + st.failed,
            in_flight=row.in_flight + st.in_flight,
            rate_per_s=row.rate_per_s + st.rate_per_s,
        )
        if st.updated_s >= latest.get(key, -1.0):  # the freshest word on what the jobs share
            latest[key] = st.updated_s
            row = msgspec.structs.replace(
                row, errors=st.errors, window=st.window, last_error=st.last_error
            )
        rows[key] = row
    return [rows[k] for k in sorted(rows)]


async def job_list(store: JobStore) -> tuple[list[str], list[str]]:
    """The jobs' names, sorted (their reduce stages, steps and shards go with them), and the
    registry's members that are not job names."""
    names, bad = await store.job_names()
    return [n for n in names if ":" not in n and "#" not in n], bad


async def read_fleet(store: JobStore) -> tuple[list[EndpointInfo] | None, str | None]:
    """The fleet registry, or None and why it cannot be read (its key holds another tool's
    value): the jobs are shown without it, none said to be waiting."""
    try:
        return await store.read_fleet(), None
    except BadRecordError as exc:
        return None, f"the fleet registry is unreadable, endpoints not shown: {exc}"


async def read_jobs(
    store: JobStore, fleet: Sequence[EndpointInfo] | None, now: float
) -> tuple[list[JobRow], list[str]]:
    """Every job as a row, and the registry's members that are not job names. A job that
    cannot be read is a row with its reason (``error``); it spoils nothing else. ``fleet``
    None: unknown (no job is said to wait for an endpoint)."""
    names, bad = await job_list(store)
    rows: list[JobRow] = []
    for name in names:
        try:
            s = await store.status(name)
            spec = await store.load_spec(name)
            stage = await store.status(stage_name(name, s.stage)) if s.stage else None
        except (BadRecordError, JobNotFoundError) as exc:
            rows.append(JobRow(job=name, state="unreadable", error=str(exc)))
            continue
        steps = await step_statuses(store, spec)
        finished, cancelled = over(s, steps)
        waiting = None
        if not (finished or cancelled) and fleet is not None:
            waiting = waiting_step(spec, s, steps, fleet, now)
        age = now - spec.created_s if spec.created_s else None
        row = _job_row(
            s, stage, spec.model, waiting, age, whole_state(finished, cancelled, waiting)
        )
        # A workflow's figures are its first step's: no ETA of the whole from them (seen:
        # "eta 0 s" with 108 agents thinking); its steps or agents say how far it is.
        if agent_of(spec) is not None:
            counts = AgentCounts.of(await store.outcome_counts(name))
            row = msgspec.structs.replace(row, agents=counts, eta_s=None)
        elif steps:  # a pipeline or another workflow: its steps' progress beside the first's
            figures = [StepFigures(st.done, st.failed, st.total) for _, st in steps]
            row = msgspec.structs.replace(row, steps=figures, eta_s=None)
        rows.append(row)
    return rows, bad


async def read_overview(store: JobStore, redis_url: str, now: float | None = None) -> Overview:
    """Every job and every endpoint, as of now."""
    now = await store.server_time() if now is None else now
    fleet, note = await read_fleet(store)
    notes = [note] if note else []
    try:
        jobs, bad = await read_jobs(store, fleet, now)
    except BadRecordError as exc:  # the job registry itself
        jobs, bad = [], []
        notes.append(f"the job registry is unreadable, no job shown: {exc}")
    notes += [f"ignored in {store.keys.jobs}: {name!r} is not a job name" for name in bad]
    stats: list[EndpointStats] = []
    for row in jobs:
        if row.live:
            # While a tree level runs, the endpoints are busy with it, not with the job.
            try:
                stats.extend(await store.read_endpoints(stage_name(row.job, row.stage)))
            except BadRecordError as exc:
                notes.append(f"job {row.job}: its endpoints' figures are unreadable: {exc}")
    tools = await store.tool_stats() if any(j.agents for j in jobs) else {}
    return Overview(
        generated_s=now,
        redis=mask_url(redis_url),
        prefix=store.keys.prefix,
        jobs=jobs,
        endpoints=_endpoint_rows(fleet or [], stats, now),
        notes=notes,
        tool_calls=tools,
    )


class History:
    """What each board said, kept for ``keep_s``: prompts answered per job (for a rate over the
    last minute) and each endpoint's published rate (for its throughput chart)."""

    def __init__(self, keep_s: float = 600.0, points: int = 60) -> None:
        self.keep_s = keep_s
        self.points = points
        self.samples: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, board: Overview) -> Overview:
        """Record ``board``; the board with recent rates, ETAs and charts filled in."""
        t = board.generated_s
        figures = {f"job|{j.job}": float(j.done + j.failed) for j in board.jobs}
        figures |= {_key(e.worker, e.endpoint): e.rate_per_s for e in board.endpoints}
        self.samples.append((t, figures))
        while self.samples and t - self.samples[0][0] > self.keep_s:
            self.samples.popleft()
        jobs = [self._job(j) for j in board.jobs]
        picked = self._picked()
        times = [round(t - then, 1) for then, _ in picked]
        endpoints = [
            msgspec.structs.replace(
                e,
                throughput=[
                    round(figures.get(_key(e.worker, e.endpoint), 0.0), 2) for _, figures in picked
                ],
            )
            for e in board.endpoints
        ]
        return msgspec.structs.replace(board, jobs=jobs, endpoints=endpoints, times=times)

    def rate(self, key: str, over_s: float) -> float | None:
        """How fast the count ``key`` grew over about the last ``over_s`` seconds, per second
        (None: a single sample); a count that went down (a retry reset it) gives 0."""
        t, now = self.samples[-1]
        for then, old in self.samples:
            if then < t and t - then <= over_s and key in old and key in now:
                return max(0.0, now[key] - old[key]) / (t - then)
        return None

    def _job(self, j: JobRow) -> JobRow:
        if j.state not in ("running", "waiting"):
            return j
        recent = self.rate(f"job|{j.job}", 60.0)
        eta = j.eta_s
        if recent is not None and j.total is not None and j.agents is None and j.steps is None:
            left = j.total - j.done - j.failed
            eta = left / recent if recent > 0 else None
        return msgspec.structs.replace(j, recent_rate_per_s=recent, eta_s=eta)

    def _picked(self) -> list[tuple[float, dict[str, float]]]:
        """At most ``points`` samples, evenly spaced, the newest last."""
        samples = list(self.samples)
        step = max(1, -(-len(samples) // self.points))
        return samples[::-1][::step][::-1]
