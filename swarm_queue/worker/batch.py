"""One batch of prompts through one endpoint (each request through the one retry loop,
:mod:`worker.retry`): lists split by sampling settings, rejected lists bisected, chat fanned
out, embeddings sent as lists too, and the answer checked and mapped by ``choice.index`` (an
embedding's ``index``). Talks to the endpoint only; Redis is the drainer's.

A list request carries one set of sampling fields, so prompts with settings of their own (an
OpenAI batch line's) go in one request per distinct setting, side by side. vLLM fails a whole
list for one prompt over the context (HTTP 400): the list is bisected until only the offending
prompts fail, each with the server's message. An answer whose choice indices repeat or fall
outside the list is a server that cannot be trusted with it (:mod:`worker.verify`): retried,
never committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import cast

import msgspec

from swarm_queue.common.chat import ToolCall
from swarm_queue.common.errors import (
    EndpointMalformed,
    EndpointRejected,
    EndpointServerError,
)
from swarm_queue.common.models import JobSpec, PromptItem, Result, SamplingParams, Usage, encode
from swarm_queue.common.perprompt import embedded
from swarm_queue.common.request import Request, Route, render
from swarm_queue.common.vocab import FailureKind
from swarm_queue.worker.circuit import GiveUp
from swarm_queue.worker.replies import ChatBody, CompletionBody, EmbeddingBody
from swarm_queue.worker.retry import RetryLoop, split_after
from swarm_queue.worker.usage import Tally
from swarm_queue.worker.verify import (
    EMBEDDINGS,
    answered_whole,
    check_choice_indices,
    check_vectors,
    map_choices,
    missing_choices,
)

__all__ = ["GIVEN_BACK", "BatchRunner"]

# The failures of a prompt on one endpoint that another endpoint may answer: given back to the
# fleet (each endpoint's a strike: see worker/batchpath.py), never committed here at once.
GIVEN_BACK = frozenset({FailureKind.NO_CHOICE, FailureKind.SERVER_ERROR})


class BatchRunner:
    """Completes batches on the endpoint of ``loop``, each request through it (the one retry
    loop: :class:`worker.retry.RetryLoop`). :meth:`run` raises
    :class:`~worker.circuit.GiveUp` when this endpoint will not finish the batch (its caller
    hands it to another)."""

    def __init__(self, loop: RetryLoop) -> None:
        self.loop = loop
        self.client, self.settings, self.metrics = loop.client, loop.settings, loop.metrics

    @property
    def retries(self) -> int:
        """Requests this endpoint was asked again (see :class:`worker.retry.RetryLoop`)."""
        return self.loop.retries

    async def run(
        self,
        spec: JobSpec,
        items: list[PromptItem],
        model: str,
        tally: Tally,
        dim: int | None = None,
        early: Callable[[Result], None] | None = None,
    ) -> list[Result]:
        """Results for ``items`` of ``spec``'s job in order, asked of ``model``; an embeddings
        job's vectors of ``dim`` dimensions, when its first answer has fixed that. ``early``
        is given each prompt's result the moment it is final, where a batch is one request per
        prompt (chat)."""
        self.metrics.batch(spec.job, self.client.label, len(items))
        groups: dict[bytes, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(b"" if item.params is None else encode(item.params), []).append(i)
        if len(groups) == 1:
            params = items[0].params_in(spec)
            return await self._complete(spec, model, items, params, 0, tally, dim, early)
        parts = await asyncio.gather(
            *(
                self._complete(
                    spec,
                    model,
                    [items[i] for i in idx],
                    items[idx[0]].params_in(spec),
                    0,
                    tally,
                    dim,
                    early,
                )
                for idx in groups.values()
            )
        )
        out: dict[int, Result] = {}
        for idx, results in zip(groups.values(), parts, strict=True):
            out.update(zip(idx, results, strict=True))
        return [out[i] for i in range(len(items))]

    async def _complete(
        self,
        spec: JobSpec,
        model: str,
        items: list[PromptItem],
        params: SamplingParams,
        prior: int,
        tally: Tally,
        dim: int | None = None,
        early: Callable[[Result], None] | None = None,
    ) -> list[Result]:
        """Results for ``items`` (all sent with ``params``) in order; bisects a rejected list
        to isolate the bad prompts; asks again for choices the server left out."""
        if spec.embed:
            return await self._embed(spec, model, items, prior, tally, dim)
        requests = [render(spec, it) for it in items]
        if requests[0].route in (Route.CHAT, Route.RESPONSES):
            return await self._chat(spec, model, items, requests, prior, tally, early)
        prompts = [r.text or "" for r in requests]
        # Every sample is a sequence of its own to the engine.
        timeout = self.settings.request_timeout_for(len(items) * (params.n or 1), params.max_tokens)
        special = requests[0].add_special_tokens

        n = params.n or 1

        async def call() -> CompletionBody:
            body = await self.client.complete(
                model, prompts, params, timeout_s=timeout, add_special_tokens=special,
                token_ids=spec.line_usage and len(prompts) > 1,
            )  # fmt: skip
            # Several samples a prompt: choice i * n + j is prompt i's sample j.
            check_choice_indices(
                self.client.label, [c.index for c in body.choices], len(prompts) * n, samples=n
            )
            return body

        def again(part: list[PromptItem], attempts: int) -> Awaitable[list[Result]]:
            return self._complete(spec, model, part, params, attempts, tally, dim)

        def flaw(body: CompletionBody) -> EndpointMalformed | None:
            want = len(prompts) * n
            if len(body.choices) >= want:  # (the answer's hot path: nothing counted)
                return None
            whole = answered_whole([c.index for c in body.choices], [n] * len(prompts))
            return missing_choices(self.client.label, len(body.choices), want, n, answered=whole)

        try:
            body, attempts = await self.loop.send(
                spec.job, call, tally, prior, flaw, split=split_after(len(items), prior)
            )
        except (EndpointRejected, EndpointServerError) as exc:
            return await self._bisect(items, exc, prior, again, model)
        mapped = map_choices(self.client.label, items, body, attempts, n)
        return await self._fill_missing(items, mapped, attempts, again, model, lambda: flaw(body))

    async def _bisect(
        self,
        items: list[PromptItem],
        exc: EndpointRejected | EndpointServerError,
        prior: int,
        again: Callable[[list[PromptItem], int], Awaitable[list[Result]]],
        model: str,
    ) -> list[Result]:
        """A list the server refused or failed on (one item over the context, or one its
        tokenizer cannot take, fails it whole): each half asked ``again``, down to the items
        that fail alone, with the server's message. A prompt the server failed on alone
        (kind ``server_error``) is another endpoint's to try (see :mod:`worker.answers`)."""
        attempts = prior + exc.tries
        if len(items) == 1:
            return [self._alone(items[0], exc, attempts, model)]
        mid = len(items) // 2
        left, right = await asyncio.gather(
            again(items[:mid], attempts), again(items[mid:], attempts)
        )
        return left + right

    def _alone(
        self,
        item: PromptItem,
        exc: EndpointRejected | EndpointServerError,
        attempts: int,
        model: str,
    ) -> Result:
        """``item``, sent alone, refused (kind ``rejected``) or failed on by the server (kind
        ``server_error``: another endpoint's to try), with the server's message."""
        if isinstance(exc, EndpointServerError):
            why = f"HTTP {exc.status} on this prompt alone: {exc.message}"
            return self._failed(item, why, FailureKind.SERVER_ERROR, attempts, exc.status, model)
        return self._failed(item, exc.message, FailureKind.REJECTED, attempts, exc.status, model)

    async def _fill_missing(
        self,
        items: list[PromptItem],
        mapped: list[Result | None],
        attempts: int,
        again: Callable[[list[PromptItem], int], Awaitable[list[Result]]],
        model: str,
        flawed: Callable[[], EndpointMalformed | None],
    ) -> list[Result]:
        """``mapped`` with the answers the server left out asked for ``again``, on their own,
        until the attempts run out; only then does an item fail for want of an answer. A
        prompt alone left out on its last attempt is the endpoint's fault if its probe, asking
        what was left out (``flawed``: the last answer's flaw), fails too: :class:`GiveUp`."""
        missing = [it for it, r in zip(items, mapped, strict=True) if r is None]
        if not missing:
            return [r for r in mapped if r is not None]
        if attempts < self.settings.max_attempts:
            more = iter(await again(missing, attempts))
        else:
            failure = flawed() if len(items) == 1 else None
            if failure is not None and not await self.loop.prompts_fault(failure):
                raise GiveUp(failure)
            reason = f"endpoint returned no choice for it in {attempts} attempts"
            more = iter(
                self._failed(it, reason, FailureKind.NO_CHOICE, attempts, model=model)
                for it in missing
            )
        return [r if r is not None else next(more) for r in mapped]

    async def _embed(
        self,
        spec: JobSpec,
        model: str,
        items: list[PromptItem],
        prior: int,
        tally: Tally,
        dim: int | None = None,
    ) -> list[Result]:
        """A batch of an embeddings job: one request holding every text of every item (an
        item's several texts are a prompt's samples, to be measured), bisected like a
        completion list when the server refuses it; vectors mapped by their ``index``. A job
        with ``line_usage`` sends each item alone, so that each has its own usage (vLLM counts
        a list's total only)."""
        if spec.line_usage and len(items) > 1:
            alone = [self._embed(spec, model, [it], prior, tally, dim) for it in items]
            return [r for part in await asyncio.gather(*alone) for r in part]
        texts = [list(it.texts) if it.texts else [render(spec, it).text or ""] for it in items]
        flat = [t for group in texts for t in group]
        timeout = self.settings.request_timeout_for(len(flat), 1)

        async def call() -> EmbeddingBody:
            body = await self.client.embed(model, flat, timeout_s=timeout)
            indices = [d.index for d in body.data]
            check_choice_indices(self.client.label, indices, len(flat), EMBEDDINGS)
            check_vectors(self.client.label, [d.embedding for d in body.data], dim)
            return body

        def again(part: list[PromptItem], attempts: int) -> Awaitable[list[Result]]:
            return self._embed(spec, model, part, attempts, tally, dim)

        def flaw(body: EmbeddingBody) -> EndpointMalformed | None:
            got = [d.index for d in body.data if d.embedding]
            if len(got) >= len(flat):
                return None
            whole = answered_whole(got, [len(group) for group in texts])
            return missing_choices(self.client.label, len(got), len(flat), answered=whole)

        try:
            body, attempts = await self.loop.send(
                spec.job, call, tally, prior, flaw, split=split_after(len(items), prior)
            )
        except (EndpointRejected, EndpointServerError) as exc:
            return await self._bisect(items, exc, prior, again, model)
        # (Each value a float: check_vectors refused any answer holding a null.)
        by_index = {d.index: cast(list[float], d.embedding) for d in body.data if d.embedding}
        # A list's usage is its total only: an item alone has it exact, a list's items null
        # (a line_usage job sends items alone: measured, one request an input is 0.21x the
        # throughput of 20,000 embeddings on instant endpoints).
        one = body.usage if len(items) == 1 else None
        usages = [None if one is None else Usage(one.prompt_tokens, 0)] * len(items)
        mapped: list[Result | None] = []
        at = 0
        for item, group, usage in zip(items, texts, usages, strict=True):
            vectors = [by_index.get(at + j) for j in range(len(group))]
            at += len(group)
            if any(v is None for v in vectors):
                mapped.append(None)
                continue
            found = Result(
                index=item.index,
                usage=usage,
                endpoint=self.client.label,
                attempts=attempts,
                custom_id=item.custom_id,
                model=body.model,
            )
            mapped.append(embedded(spec, found, group, [v for v in vectors if v]))
        return await self._fill_missing(items, mapped, attempts, again, model, lambda: flaw(body))

    async def _chat(
        self,
        spec: JobSpec,
        model: str,
        items: list[PromptItem],
        requests: list[Request],
        prior: int,
        tally: Tally,
        early: Callable[[Result], None] | None = None,
    ) -> list[Result]:
        """A batch of a chat job: one chat (or responses) request per prompt, all in flight
        at once (chat has no list form); a rejected prompt fails alone. Each result goes to
        ``early`` the moment it is final."""

        async def one(item: PromptItem, request: Request) -> Result:
            messages, params, tools = request.messages or [], request.params, request.tools
            choose = request.tool_choice
            timeout = self.settings.request_timeout_for(1, params.max_tokens)

            n = params.n or 1

            async def call() -> ChatBody:
                if request.route == Route.RESPONSES:
                    body = await self.client.respond(model, messages, params, timeout_s=timeout)
                else:
                    body = await self.client.chat(
                        model, messages, params, timeout_s=timeout, tools=tools, tool_choice=choose
                    )
                check_choice_indices(
                    self.client.label, [c.index for c in body.choices], n, samples=n
                )
                if len(body.choices) < n:
                    raise EndpointMalformed(
                        self.client.label,
                        f"malformed answer: {len(body.choices)} of {n} choices",
                        samples=n,
                    )
                body.choices.sort(key=lambda c: c.index)
                return body

            try:
                body, attempts = await self.loop.send(spec.job, call, tally, prior)
            except (EndpointRejected, EndpointServerError) as exc:
                return self._alone(item, exc, prior + exc.tries, model)
            usage = body.usage.usage() if body.usage is not None else None
            choice = body.choices[0]
            if tools and choice.message.tool_calls:
                # An agent's turn that asks for tools: the calls are its answer (with content
                # None from a tool parser, "" from a call forced by tool_choice).
                calls = [
                    ToolCall(c.id, c.function.name, c.function.arguments)
                    for c in choice.message.tool_calls
                ]
                return Result(
                    index=item.index,
                    finish_reason=choice.finish_reason,
                    usage=usage,
                    endpoint=self.client.label,
                    attempts=attempts,
                    custom_id=item.custom_id,
                    model=body.model,
                    tool_calls=calls,
                    fingerprint=body.system_fingerprint,
                )
            if choice.message.content is None:
                # Not an answer: counting it a success would hand "" on (and to the cache).
                why = (
                    f"the answer has no text (message.content null, "
                    f"{choice.message.without_content()}; finish_reason "
                    f"{choice.finish_reason!r})"
                )
                failed = self._failed(item, why, FailureKind.NO_CONTENT, attempts, model=model)
                return msgspec.structs.replace(
                    failed, finish_reason=choice.finish_reason, usage=usage, model=body.model
                )
            return Result(
                index=item.index,
                text=choice.message.content,
                finish_reason=choice.finish_reason,
                usage=usage,
                endpoint=self.client.label,
                attempts=attempts,
                custom_id=item.custom_id,
                model=body.model,
                samples=[c.message.content or "" for c in body.choices] if n > 1 else None,
                finishes=[c.finish_reason for c in body.choices] if n > 1 else None,
                fingerprint=body.system_fingerprint,
                echo=body.echo if request.route == Route.RESPONSES else None,
            )

        async def told(item: PromptItem, request: Request) -> Result:
            result = await one(item, request)
            if early is not None and result.error_kind not in GIVEN_BACK:
                early(result)
            return result

        return list(
            await asyncio.gather(*(told(it, r) for it, r in zip(items, requests, strict=True)))
        )

    def _failed(
        self,
        item: PromptItem,
        reason: str,
        kind: str,
        attempts: int,
        status: int | None = None,
        model: str = "",
    ) -> Result:
        """``item``'s failure; ``model``: the one it was asked of (a line names it, as an
        answer's does: seen ``"model": ""`` on every rejected prompt)."""
        return Result(
            index=item.index,
            endpoint=self.client.label,
            attempts=attempts,
            error=reason,
            error_kind=kind,
            custom_id=item.custom_id,
            status=status,
            model=model,
        )
