"""Run an OpenAI Batch API file on the fleet with the official SDK, unchanged from OpenAI's:
upload it, create the batch, poll it, download its output (and error) file.

    python examples/openai_batch.py requests.jsonl [results.jsonl]

The gateway is ``$OPENAI_BASE_URL`` (``swarm-gateway``'s ``http://HOST:8080/v1``), the key
``$OPENAI_API_KEY`` (one of the gateway's keys; any word when it has none). Each line of
``requests.jsonl`` is ``{"custom_id", "method": "POST", "url", "body"}`` for one of
``/v1/completions``, ``/v1/chat/completions``, ``/v1/embeddings``, ``/v1/responses``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import openai


def main() -> int:
    source = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else "results.jsonl"
    os.environ.setdefault("OPENAI_API_KEY", "none")
    client = openai.OpenAI()
    _wait_for_gateway(client)
    with open(source, encoding="utf-8") as fh:
        endpoint = json.loads(fh.readline())["url"]  # a batch is of one endpoint

    # The five lines a user of OpenAI's batches already has:
    with open(source, "rb") as requests:
        uploaded = client.files.create(file=requests, purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h"
    )
    while (batch := client.batches.retrieve(batch.id)).status not in _OVER:
        time.sleep(1)
    if batch.output_file_id:
        client.files.content(batch.output_file_id).write_to_file(out)

    counts = batch.request_counts
    print(f"batch {batch.id}: {batch.status}, {counts.completed} of {counts.total} answered")
    if batch.error_file_id:
        client.files.content(batch.error_file_id).write_to_file(f"{out}.errors")
        print(f"{counts.failed} failed: their lines are in {out}.errors")
    for error in batch.errors.data if batch.errors else []:
        print(f"line {error.line}: {error.code}: {error.message}")
    return 0 if batch.status == "completed" else 1


_OVER = ("completed", "failed", "expired", "cancelled")


def _wait_for_gateway(client: openai.OpenAI, timeout_s: float = 60.0) -> None:
    """Until the gateway answers (it may have been started a moment ago)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.models.list()
            return
        except openai.APIConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


if __name__ == "__main__":
    raise SystemExit(main())
