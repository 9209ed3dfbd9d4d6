"""The later steps of a workflow's job: those its output names
(:meth:`common.output.JobOutput.later`: an agent job's turns, a best-of job's judge), and a
pipeline's steps (``job:s1``..., each named by the link of the step before). What
``swarm-status``, ``swarm-cancel`` and ``swarm-jobs`` speak for when they are given the job's
name: a workflow is finished when its last step is, never when its first is."""

from __future__ import annotations

from swarm_queue.common.errors import BadRecordError, JobNotFoundError
from swarm_queue.common.models import JobSpec
from swarm_queue.common.store import JobStatus, JobStore
from swarm_queue.flows.pipeline.spec import link_of
from swarm_queue.flows.registry import output_of

__all__ = ["later_steps", "over", "step_statuses", "tokens_of"]


async def later_steps(store: JobStore, spec: JobSpec) -> list[JobSpec]:
    """The specs of the later steps of ``spec``'s job, in order (none for a plain job, or for
    a step itself): those its output names (an agent job's turns, a best-of job's judge), then
    each step's link to the next (a pipeline's); a step that cannot be read ends the list."""
    output = output_of(spec)
    names = output.later(spec) if output is not None else []
    out: list[JobSpec] = []
    current: JobSpec | None = spec
    while True:
        if names:
            name = names.pop(0)
        elif current is not None and (link := link_of(current)) is not None:
            name = link.job
        else:
            return out
        try:
            current = await store.load_spec(name)
        except (JobNotFoundError, BadRecordError):
            return out
        out.append(current)


async def step_statuses(store: JobStore, spec: JobSpec) -> list[tuple[JobSpec, JobStatus]]:
    """Each later step of ``spec``'s job with its status."""
    return [
        (step, await store.status(step.job, rate=False)) for step in await later_steps(store, spec)
    ]


def over(status: JobStatus, steps: list[tuple[JobSpec, JobStatus]]) -> tuple[bool, bool]:
    """(finished, cancelled) of a job with its later ``steps``: finished once every step is
    finished or cancelled; cancelled when the first was."""
    ended = all(s.finished or s.cancelled for _, s in steps)
    return (status.finished and ended, status.cancelled and ended)


def tokens_of(
    status: JobStatus, steps: list[tuple[JobSpec, JobStatus]]
) -> tuple[int, int, int, int]:
    """(prompt, completion, cached, reasoning) tokens of a job with its later ``steps``: an
    agent job's every turn, a pipeline's every step, not the first alone."""
    every = [status, *(s for _, s in steps)]
    return (
        sum(s.prompt_tokens for s in every),
        sum(s.completion_tokens for s in every),
        sum(s.cached_tokens for s in every),
        sum(s.reasoning_tokens for s in every),
    )
