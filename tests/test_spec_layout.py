"""A job's spec as its parts (a core, the request kind, the flow, the place in a workflow):
what each part says, read as the flows and the drain path read it, and one layout on the
wire."""

from __future__ import annotations

import msgspec
import pytest

from swarm_queue.common.jobspec import JobOptions
from swarm_queue.common.keys import group_of
from swarm_queue.common.models import (
    Chat,
    Completion,
    Embedding,
    FlowRef,
    JobSpec,
    decode_spec,
    encode,
)
from swarm_queue.common.store import JobStore
from swarm_queue.common.vocab import Meta
from swarm_queue.flows.agents.spec import AgentSpec, agent_of, build_agents, tool_definition
from swarm_queue.flows.pipeline.spec import Link, StepOptions, build_pipeline, link_of


def _today() -> dict[str, JobSpec]:
    """What today's builders make of the settings the stored specs were made with."""
    steps = [StepOptions(template="Summarise: {answer}", keep_if="yes")]
    pipeline, _ = build_pipeline(
        "p",
        JobOptions(max_tokens=4, model="m"),
        [*steps, StepOptions(template="Judge: {answer}")],
        source="t",
    )
    agent = AgentSpec(max_turns=3, output_schema={"type": "object"}, tool_choice="required")
    agents, _ = build_agents(
        "a", JobOptions(max_tokens=8, model="m"), agent, [tool_definition("fetch")], source="t"
    )
    specs = [
        JobSpec(job="plain", model="m", request=Completion(template="<s>{prompt}")),
        JobSpec(job="c", request=Chat(template="Q: {prompt}")),
        JobSpec(job="e", request=Embedding(), model="emb"),
        *pipeline,
        *agents,
    ]
    return {
        s.job: msgspec.structs.replace(s, generation=f"gen-{s.job}", created_s=1.5) for s in specs
    }


async def test_each_part_of_a_stored_spec_says_what_the_builders_made(store: JobStore) -> None:
    today = _today()
    for job, spec in today.items():
        await store.redis.hset(store.keys.meta(job), Meta.SPEC, encode(spec))
    loaded = {job: await store.load_spec(job) for job in today}
    assert loaded == today
    # What each part says, read as the flows and the drain path read it.
    link = link_of(loaded["p"])
    assert link == Link(job="p:s1", template="Summarise: {answer}", keep_if="yes")
    assert loaded["p"].flow == FlowRef(kind="pipeline", settings=msgspec.to_builtins(link))
    assert link_of(loaded["p:s2"]) is None and loaded["p:s2"].flow is None
    assert [group_of(n) for n in ("p", "p:s1", "p:s2")] == [("p", 0), ("p", 1), ("p", 2)]
    turns = [loaded[n] for n in ("a", "a:s1", "a:s2")]
    assert [agent_of(t) for t in turns] == [AgentSpec(
        max_turns=3, output_schema={"type": "object"}, tool_choice="required"
    )] * 3  # fmt: skip
    assert [(t.affinity, t.flow is not None and t.flow.failures) for t in turns] == [
        (False, True),
        (True, True),
        (True, True),
    ]
    assert [t.request.tool_choice for t in turns if isinstance(t.request, Chat)] == [
        "required",
        "required",
        "none",
    ]
    assert loaded["c"].chat and loaded["c"].render("x") == "Q: x"
    assert loaded["e"].embed and loaded["plain"].template == "<s>{prompt}"


@pytest.mark.parametrize("job", ["plain", "c", "e", "p", "p:s1", "p:s2", "a", "a:s1", "a:s2"])
def test_a_spec_round_trips_in_one_layout_whose_version_is_written_only_when_it_changes(
    job: str,
) -> None:
    spec = _today()[job]
    raw = encode(spec)
    assert decode_spec(raw) == spec and spec.version == 1
    assert "version" not in msgspec.msgpack.decode(raw)
