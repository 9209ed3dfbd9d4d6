"""Interop check of the Batch API against a real vLLM: the official ``openai`` SDK drives
batches of each line kind (completions, chat with ``n``, responses, embeddings) through
``swarm-gateway`` and a worker process; each output line's body (every field of the SDK's own
type for it, less ids and times: :mod:`bench.sdkview`) equal to vLLM's own answer to that
request sent alone, each refused line alone in the error file with vLLM's
own message, and each batch's usage the sum of its lines'; the prompt tokens vLLM found
cached, per line and summed in the batch's usage. Run by bench/interop_vllm.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import openai

from bench.sdkview import sdk_view
from bench.vllm_checks import BIN, REPO, WORK, Checks
from swarm_queue.common.embedded import free_port

__all__ = ["gateway_batches"]

LONG = "word " * 500  # over the tiny model's context of 2048 tokens on its own


def _post(url: str, route: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """vLLM's own answer to one request sent alone: its status and body."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        f"{url}/v1/{route}",
        data=json.dumps({"model": "tiny-llama", **body}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _line(i: int, url: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": f"l{i}", "method": "POST", "url": url, "body": body}


def _usage(route: str, body: dict[str, Any]) -> tuple[int, int]:
    u = body["usage"]
    if route == "responses":
        return u["input_tokens"], u["output_tokens"]
    return u["prompt_tokens"], u.get("completion_tokens") or 0


# Each batch: its endpoint, its lines' bodies, and what of an answer is compared.
def _batches() -> list[tuple[str, list[dict[str, Any]]]]:
    texts = [{"input": f"Observation {i} of the survey."} for i in range(6)] + [{"input": LONG}]
    completions = [{"prompt": f"Check paper {i}.", "max_tokens": 16, "temperature": 0}
                   for i in range(6)]  # fmt: skip
    completions.append({"prompt": LONG, "max_tokens": 16, "temperature": 0})
    chat = [
        {"messages": [{"role": "user", "content": f"Weigh finding {i}."}], "max_tokens": 12,
         "n": 2, "temperature": 0.8, "seed": i + 1}
        for i in range(4)
    ]  # fmt: skip
    chat.append({"messages": [{"role": "user", "content": "Weigh it."}], "max_tokens": 12,
                 "n": 2, "temperature": 0})  # fmt: skip
    responses = [
        {"input": f"Name finding {i}.", "max_output_tokens": 16, "temperature": 0}
        | ({"instructions": "Be brief."} if i % 2 else {})
        for i in range(6)
    ]
    responses.append({"input": LONG, "max_output_tokens": 16, "temperature": 0})
    return [
        ("completions", completions),
        ("chat/completions", chat),
        ("responses", responses),
        ("embeddings", texts),
    ]


def gateway_batches(checks: Checks, env: dict[str, str], url: str, pooled: str) -> None:
    """Batches of each line kind through the gateway (the SDK its client), one worker on
    ``url`` (generation) and ``pooled`` (embeddings: vLLM's pooling runner)."""
    files, port = WORK / "gateway-files", free_port()
    with open(WORK / "gateway.log", "wb") as glog, open(WORK / "worker-gw.log", "wb") as wlog:
        gateway = subprocess.Popen(
            [BIN / "swarm-gateway", "--port", str(port), "--dir", files],
            env=env, stdout=glog, stderr=subprocess.STDOUT,
        )  # fmt: skip
        worker = subprocess.Popen(
            [sys.executable, "-m", "swarm_queue.worker.main"], cwd=REPO,
            env={**env, "SWARM_ENDPOINTS": f"{url},{pooled}", "SWARM_WORKER_NAME": "gw"},
            stdout=wlog, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        for route, bodies in _batches():
            server = pooled if route == "embeddings" else url
            _batch(checks, client, server, route, bodies)
        _cached(checks, client)
    finally:
        for proc in (worker, gateway):
            proc.terminate()
            proc.wait(60)


def _batch(
    checks: Checks,
    client: openai.OpenAI,
    url: str,
    route: str,
    bodies: list[dict[str, Any]],
) -> None:
    endpoint = f"/v1/{route}"
    lines = [_line(i, endpoint, b | {"model": "tiny-llama"}) for i, b in enumerate(bodies)]
    batch, out = _run(client, route, lines)
    bad, usage, refused = [], [0, 0], 0
    for line in lines:
        status, own = _post(url, route, line["body"])
        got = out.get(line["custom_id"])
        if got is None:
            bad.append(line["custom_id"])
        elif status == 200:
            mine, theirs = sdk_view(route, got["response"]["body"]), sdk_view(route, own)
            ok = got["response"]["status_code"] == 200 and mine == theirs
            if not ok:
                differ = sorted(
                    k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)
                )
                bad.append(f"{line['custom_id']} ({', '.join(differ)})")
            usage = [a + b for a, b in zip(usage, _usage(route, own), strict=True)]
        else:
            refused += 1
            ok = (got["response"]["status_code"], got["error"]["message"]) == (
                status, own["error"]["message"],
            )  # fmt: skip
            bad += [] if ok else [line["custom_id"]]
    total = (batch.usage.input_tokens, batch.usage.output_tokens) if batch.usage else None
    checks.check(
        batch.status == "completed" and not bad and total == tuple(usage),
        f"the Batch API through swarm-gateway, {endpoint}: {len(lines) - len(bad)}/{len(lines)} "
        f"lines' bodies (every field of the SDK's type, less ids and times) equal to vLLM's own "
        f"answer alone ({refused} refused, with vLLM's message), the batch's usage their sum",
        f"{batch.status}; differ at {bad[:5]}; usage {total} against {tuple(usage)}",
    )


def _run(client: openai.OpenAI, route: str, lines: list[dict[str, Any]], name: str = "") -> Any:
    """A batch of ``lines`` to ``/v1/{route}`` run to its end: the batch, and its output and
    error lines by custom_id."""
    src = WORK / f"gw-{name or route.replace('/', '-')}.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    for _ in range(60):  # the gateway starting
        try:
            file = client.files.create(file=(src.name, src.read_bytes()), purpose="batch")
            break
        except openai.APIConnectionError:
            time.sleep(1)
    batch = client.batches.create(
        input_file_id=file.id, endpoint=f"/v1/{route}", completion_window="24h"
    )
    while (batch := client.batches.retrieve(batch.id)).status not in (
        "completed", "failed", "expired", "cancelled",
    ):  # fmt: skip
        time.sleep(0.5)
    return batch, _lines(client, batch.output_file_id) | _lines(client, batch.error_file_id)


def _cached(checks: Checks, client: openai.OpenAI) -> None:
    """Responses lines sharing long instructions: vLLM's responses say the prompt tokens its
    prefix cache held; each line says its own, the batch's usage their sum."""
    shared = "Read the survey's notes with care and answer in one line. " * 30
    bodies = [{"input": f"Name finding {i}.", "instructions": shared, "max_output_tokens": 4,
               "temperature": 0, "model": "tiny-llama"} for i in range(6)]  # fmt: skip
    lines = [_line(i, "/v1/responses", b) for i, b in enumerate(bodies)]
    batch, out = _run(client, "responses", lines, "cached")
    each = [
        x["response"]["body"]["usage"]["input_tokens_details"]["cached_tokens"]
        for x in out.values()
        if x["response"]["status_code"] == 200
    ]
    total = batch.usage.input_tokens_details.cached_tokens if batch.usage else None
    checks.check(
        batch.status == "completed" and len(each) == 6 and total == sum(each) > 0,
        "the Batch API through swarm-gateway, cached tokens: each responses line says the "
        f"prompt tokens vLLM found cached ({sum(each)} in 6 lines sharing instructions), the "
        "batch's usage their sum",
        f"{batch.status}; lines {each}; batch {total}",
    )


def _lines(client: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    if file_id is None:
        return {}
    text = client.files.content(file_id).text
    return {x["custom_id"]: x for x in map(json.loads, text.splitlines())}


if __name__ == "__main__":  # against running servers: python -m bench.interop_gateway URL POOLED
    from swarm_queue.common.embedded import EmbeddedRedis

    WORK.mkdir(parents=True, exist_ok=True)
    with EmbeddedRedis() as redis:
        env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("SWARM_")}
        env.update(SWARM_REDIS_URL=redis.url, SWARM_PREFIX="interop", SWARM_POLL_MS="50")
        found = Checks()
        gateway_batches(found, env, sys.argv[1], sys.argv[2])
    raise SystemExit(1 if found.failed else 0)
