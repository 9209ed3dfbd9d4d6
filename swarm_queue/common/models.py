"""A job's messages on the wire as msgspec Structs: spec, prompts, results, output lines,
reduce output (the fleet's figures: :mod:`common.fleet`, the cache's: :mod:`common.cache`).

Redis holds msgpack (compact, fast); the collector writes JSON Lines. Encoders and decoders are
built once here and reused. New fields must get defaults so that old records still decode.
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal

import msgspec

from swarm_queue.common.chat import Message, ToolCall
from swarm_queue.common.errors import ConfigError
from swarm_queue.common.reducekinds import reduce_problem
from swarm_queue.common.vectors import unpack_vector
from swarm_queue.common.vocab import FailureKind

__all__ = [
    "Chat",
    "Completion",
    "Embedding",
    "FlowRef",
    "JobSpec",
    "PerPrompt",
    "PromptItem",
    "ReduceSpec",
    "RequestKind",
    "Result",
    "SamplingParams",
    "Usage",
    "decode_item",
    "decode_result",
    "decode_spec",
    "encode",
    "result_or_failure",
    "timestamp_s",
]


def timestamp_s() -> float:
    """Wall-clock seconds, to the millisecond: how records carry their times."""
    return round(time.time(), 3)


# The largest max_tokens accepted: far beyond any context, and within a 32-bit integer.
MAX_TOKENS_LIMIT = 2**31 - 1
# The most samples per prompt: a study's self-consistency runs 5 to 40.
MAX_SAMPLES = 256


class SamplingParams(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=False):
    """Sampling settings sent with every request of a job; None means the server's default.

    ``response_format`` (OpenAI's ``{"type": "json_schema", ...}``) and ``structured_outputs``
    (vLLM's ``{"json": schema}``, ``{"regex": ...}``, ``{"choice": [...]}``) are passed through
    as given: they constrain decoding on the server.
    """

    max_tokens: int = 256
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    # Samples per prompt (vLLM's ``n``; None: one).
    n: int | None = None

    def __post_init__(self) -> None:
        # Refused here, with the value named, rather than by every request of the job (or
        # by an encoder that cannot hold the number).
        if not 1 <= self.max_tokens <= MAX_TOKENS_LIMIT:
            raise ConfigError(f"max_tokens must be 1..{MAX_TOKENS_LIMIT}, got {self.max_tokens}")
        if self.temperature is not None and not (
            math.isfinite(self.temperature) and self.temperature >= 0
        ):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_p is not None and not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise ConfigError(f"seed must fit in 64 bits, got {self.seed}")
        if self.n is not None and not 1 <= self.n <= MAX_SAMPLES:
            raise ConfigError(f"samples (n) must be 1..{MAX_SAMPLES}, got {self.n}")

    def extra(self) -> dict[str, Any]:
        """Every parameter besides ``max_tokens`` that is set, as request fields."""
        names = (
            "temperature",
            "top_p",
            "stop",
            "seed",
            "response_format",
            "structured_outputs",
            "n",
        )
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


class ReduceSpec(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """The reduce stage of a job: what to make of its ordered results once all are in.

    ``kind`` is one of :data:`common.reducekinds.REDUCE_KINDS`. ``function``
    (``package.module:function``) is the user's aggregator for ``function``; ``prompt`` (with
    ``{responses}`` and ``{level}``) and ``fanin`` drive ``tree``, whose supervisor prompts
    may generate ``max_tokens`` each (0: twice the job's own).
    """

    kind: str
    function: str | None = None
    prompt: str | None = None
    fanin: int = 10
    max_tokens: int = 0
    separator: str = "\n"

    def __post_init__(self) -> None:
        problem = reduce_problem(self)
        if problem is not None:
            raise ConfigError(problem)
        if self.max_tokens < 0:
            raise ConfigError(f"reduce max_tokens must be >= 0, got {self.max_tokens}")


class PerPrompt(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """What a job makes of each prompt's samples (see :mod:`common.perprompt`): ``kind``;
    for the uncertainty measures the embeddings ``model`` their samples are embedded with,
    and (semantic entropy) the cosine ``similarity`` at which two answers mean the same."""

    kind: str
    model: str | None = None
    similarity: float = 0.9


class Completion(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="kind", tag=True):
    """A job's prompts sent in list-prompt /v1/completions batches: each as given, or
    ``template`` with ``{prompt}`` replaced (a chat template written out, for list-prompt
    batching of an instruction-tuned model)."""

    template: str | None = None


class Chat(
    msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True, tag_field="kind", tag=True
):
    """A job's prompts sent as one /v1/chat/completions request each: a prompt as the user
    message (or ``template`` with ``{prompt}`` replaced), or its own conversation. ``tools``
    are offered with every request, as OpenAI's
    chat API takes them (``{"type": "function", "function": {...}}``): an answer may be tool
    calls instead of text; ``tool_choice`` is sent with them (``"required"``, ``"none"``,
    ``{"type": "function", "function": {"name": ...}}``; None: not sent, the server's
    default, ``"auto"``). ``api`` "responses": each conversation goes to /v1/responses
    (OpenAI's Responses API, its ``input``) instead, and is answered the same."""

    template: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    api: Literal["chat", "responses"] = "chat"


class Embedding(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="kind", tag=True):
    """A job's prompts sent to /v1/embeddings, a list of inputs a request: each answer is a
    vector, no text."""


# What a job's prompts are sent as: the request kind, tagged on the wire by its name.
RequestKind = Completion | Chat | Embedding


class FlowRef(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """Where a job's committed answers go on: each lands in the job's ``landed`` stream in the
    same atomic step as its commit, for the flow named ``kind`` (one of ``flows/registry.py``)
    to make the next unit of work of it; a failure too with ``failures``. ``settings`` are the
    flow's own (decoded by the flow alone: the queue and the drain path never read them)."""

    kind: str
    failures: bool = False
    settings: dict[str, Any] = {}


# The fields of a JobSpec that say how a job was made, not what it asks for.
_NOT_SETTINGS = frozenset({"job", "created_s", "source", "generation"})


class JobSpec(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a job is: written once by the first ``swarm-enqueue``, read by every worker.

    A core (model, sampling, priority, cache, schema, reduce), the kind of request its
    prompts are sent as, whether its entries have an affinity, and the flow its answers go
    on to (its place in a workflow is its name's: :func:`common.keys.group_of`). ``model``
    None means "whatever model the endpoint serves" (read from ``/v1/models``).
    """

    job: str
    params: SamplingParams = SamplingParams()
    model: str | None = None
    created_s: float = 0.0
    source: str = ""
    reduce: ReduceSpec | None = None
    request: RequestKind = Completion()
    # A JSON Schema every answer must match (see common.schema); a mismatch is a failure of
    # kind "schema", its text kept, retryable with swarm-retry --kind schema.
    schema: dict[str, Any] | None = None
    # While a job of higher priority has work, the endpoints serve it first; jobs of equal
    # priority share them in turn.
    priority: int = 0
    # Answer prompts from the response cache shared by every job of this Redis, and keep new
    # answers in it (see common.cache); sampled requests too with ``cache_sampled``.
    cache: bool = False
    cache_sampled: bool = False
    # With ``cache``: never answer from the cache, ask again and replace what it keeps (after
    # an endpoint answered wrongly for a while).
    cache_refresh: bool = False
    # With several samples a prompt (params.n): what is made of them, per prompt.
    per_prompt: PerPrompt | None = None
    # Each output line says its prompt's own token counts even where prompts shared a request
    # (vLLM counts a list's total only): list completions ask for token ids, embeddings go one
    # input a request. It costs throughput; the job's total is exact either way.
    line_usage: bool = False
    # Where its committed answers go on (None: nowhere, they are only collected).
    flow: FlowRef | None = None
    # Who it is for: the jobs of one project share its turn in the service order, so that a
    # project gets its share of the fleet however many jobs it has ("": a share of its own).
    project: str = ""
    # When it should be done (epoch seconds, 0: no deadline): of a project's jobs of equal
    # priority, the one whose deadline comes first is served first.
    deadline_s: float = 0.0
    # Its entries have an affinity: each may be queued in the lane of the endpoint whose
    # engine holds its prefix (see common/store/lanes.py), which takes it first; another
    # endpoint takes it only late. Its group (common.keys.group_of) shares one turn.
    affinity: bool = False
    # Prompts to a stream entry (consecutive ones, of one affinity key): read, claimed and
    # acknowledged as one, a tenth of Redis's work a prompt at 16 (see common/store/entries.py).
    chunk: int = 1
    # Redis Cluster slots its prompts are spread over (see common/shards.py).
    shards: int = 1
    # Which life of the name this is: set when the job is created (a random token), so that
    # work taken from a job deleted and queued again under its name is never written into the
    # new one. Not a setting: a spec asked for has none.
    generation: str = ""
    # The layout this spec was written in: a later layout says a higher one, so that a reader
    # knows what it reads (none has come yet).
    version: int = 1

    def __post_init__(self) -> None:  # (a workflow's answers move on one by one, as they come)
        if self.chunk > 1 and self.flow is not None:
            raise ConfigError("a workflow's steps take no chunk: leave it at 1 (--chunk 1)")
        if self.shards != 1 and (self.flow is not None or self.reduce is not None):
            raise ConfigError("only a plain job is spread over shards: leave --shards at 1")

    @property
    def chat(self) -> bool:
        """Whether its prompts are sent to the chat API."""
        return isinstance(self.request, Chat)

    @property
    def embed(self) -> bool:
        """Whether its prompts are embedded rather than answered."""
        return isinstance(self.request, Embedding)

    @property
    def template(self) -> str | None:
        """The template its prompts are put into (None: sent as given)."""
        return None if isinstance(self.request, Embedding) else self.request.template

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The tools offered with its chat requests."""
        return self.request.tools if isinstance(self.request, Chat) else None

    def same_settings(self, other: JobSpec) -> bool:
        """True when ``other`` asks for the same model, sampling, reduce and every other
        setting (creation details aside: every field is a setting but those)."""
        return not self.differing_settings(other)

    def differing_settings(self, other: JobSpec) -> list[str]:
        """The settings ``other`` asks for otherwise, by name."""
        return [
            name
            for name in self.__struct_fields__
            if name not in _NOT_SETTINGS and getattr(self, name) != getattr(other, name)
        ]

    def render(self, prompt: str) -> str:
        """What is sent for ``prompt``: the template filled in, or the prompt itself."""
        template = self.template
        return prompt if template is None else template.replace("{prompt}", prompt)


class PromptItem(msgspec.Struct, frozen=True, array_like=True):
    """One queued prompt: the body of a stream entry (field ``d``).

    ``messages``: a whole conversation (system prompt, earlier turns) for a chat job, sent as
    is; ``prompt`` then holds its last user message, for display.
    """

    index: int
    prompt: str
    custom_id: str | None = None
    messages: tuple[Message, ...] | None = None
    # This prompt's own request settings (an OpenAI batch line's body); None: the job's.
    params: SamplingParams | None = None
    # In a pipeline's later step: the input index this item comes from, and that input's
    # prompt (what the step templates' ``{prompt}`` is). None in a job's own input.
    origin: int | None = None
    root: str | None = None
    # In an embeddings job: several texts to embed for this one prompt (a prompt's samples,
    # for an uncertainty measure); None: its prompt alone.
    texts: tuple[str, ...] | None = None
    # This prompt's own tool_choice (an agent's repair turn: "none"); None: its job's.
    tool_choice: str | dict[str, Any] | None = None

    @classmethod
    def of(
        cls,
        index: int,
        prompt: str | tuple[Message, ...],
        custom_id: str | None,
        params: SamplingParams | None = None,
    ) -> PromptItem:
        """The item of a text prompt, or of a conversation (shown by its last user message)."""
        if isinstance(prompt, str):
            return cls(index, prompt, custom_id, None, params)
        users = [m.content for m in prompt if m.role == "user"]
        return cls(index, users[-1] if users else "", custom_id, prompt, params)

    def params_in(self, spec: JobSpec) -> SamplingParams:
        """The settings this prompt is sent with: its own, else its job's."""
        return self.params if self.params is not None else spec.params


class Usage(msgspec.Struct, frozen=True, omit_defaults=True):
    """Token counts of one prompt, present only when the endpoint reported them exactly; of
    them, the prompt tokens its engine found in its prefix cache and the completion tokens
    spent reasoning, where the engine reports them (None: not reported)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None

    def counts(self) -> tuple[int, int, int, int]:
        """Prompt, completion, cached and reasoning tokens, as totals add them (0: none)."""
        return (
            self.prompt_tokens,
            self.completion_tokens,
            self.cached_tokens or 0,
            self.reasoning_tokens or 0,
        )


class Result(msgspec.Struct, frozen=True, omit_defaults=True):
    """The outcome of one prompt, success or failure, stored under its index."""

    index: int
    text: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    endpoint: str = ""
    attempts: int = 0
    error: str | None = None
    # Machine-readable error class ("rejected", "no_choice", ...): what swarm-retry filters on.
    error_kind: str | None = None
    custom_id: str | None = None
    # The model that answered, as the endpoint named it.
    model: str = ""
    # The HTTP status of the server's refusal of this prompt (``rejected``), when it gave one.
    status: int | None = None
    # Answered from the response cache, with the answer another job got (``endpoint``: where).
    cached: bool = False
    # An embeddings job's answer: the vector (see pack_vector), and no text.
    embedding: bytes | None = None
    # Every sample of a prompt sampled several times (``text``: the first, or the answer its
    # per-prompt reduce chose), and what that reduce made of them.
    samples: list[str] | None = None
    # Each sample's finish reason, in the order of ``samples``.
    finishes: list[str | None] | None = None
    value: dict[str, Any] | None = None
    # An answer that asks for tools instead of answering (an agent's turn): no text.
    tool_calls: list[ToolCall] | None = None
    # The engine's ``system_fingerprint`` (vLLM: its version and configuration's hash), where
    # it said one: which engine answered, for an output line as the engine writes it.
    fingerprint: str | None = msgspec.field(default=None, name="fp")
    # A /v1/responses answer's other fields as the engine wrote them (its echo of the
    # request: instructions, sampling, tools...), for the output line's body.
    echo: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def vector(self) -> list[float] | None:
        """An embeddings job's answer as a list of floats (``embedding`` holds its bytes)."""
        return None if self.embedding is None else unpack_vector(self.embedding)

    def array(self) -> Any:
        """An embeddings job's answer as a numpy float32 array (needs numpy)."""
        import numpy as np

        if self.embedding is None:
            return None
        return np.frombuffer(self.embedding, dtype="<f4").copy()


_msgpack_encoder = msgspec.msgpack.Encoder()
_json_encoder = msgspec.json.Encoder()
_spec_decoder = msgspec.msgpack.Decoder(JobSpec)
_item_decoder = msgspec.msgpack.Decoder(PromptItem)
_result_decoder = msgspec.msgpack.Decoder(Result)


def encode(obj: msgspec.Struct) -> bytes:
    """msgpack bytes for Redis."""
    return _msgpack_encoder.encode(obj)


def decode_spec(data: bytes) -> JobSpec:
    """A stored spec."""
    return _spec_decoder.decode(data)


def decode_item(data: bytes) -> PromptItem:
    return _item_decoder.decode(data)


def decode_result(data: bytes) -> Result:
    return _result_decoder.decode(data)


def result_or_failure(index: int, data: bytes) -> Result:
    """The result stored under ``index``, or a failure saying it cannot be read (a record
    damaged or written by something else fails its own prompt, nothing more)."""
    try:
        result = _result_decoder.decode(data)
    except msgspec.DecodeError as exc:
        return Result(
            index=index,
            error=f"unreadable result in Redis: {exc}",
            error_kind=FailureKind.BAD_ENTRY,
        )
    if result.index != index:
        return Result(
            index=index,
            error=f"result in Redis under {index} is for index {result.index}",
            error_kind=FailureKind.BAD_ENTRY,
        )
    return result
