"""swarm-gateway with the official openai SDK as its client (no hand-written HTTP), real gateway
and worker processes, swarm-sim endpoints and a real Redis: batches of every endpoint checked
line by line against the simulator's answers, OpenAI's validation errors with their lines, two
projects that cannot see each other, a cancel, and a gateway killed mid-batch."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import openai
import pytest

from swarm_queue.common.embedded import free_port
from swarm_queue.common.keys import Keys
from swarm_queue.common.vectors import pack_vector, unpack_vector
from swarm_queue.sim.text import completion_for, count_tokens, embedding_for
from tests import gatewayproc as gw
from tests.harness import (
    BIN,
    MAX_TOKENS,
    OVER_CONTEXT,
    Fleet,
    FleetFactory,
    check_output,
    collect,
    fleet_prompt,
    sync_client,
    wrong_key_endpoint,
)


def _wait_collected(files: Path, lines: int, stall_s: float = 120.0) -> None:
    """Until a batch's work file (its collected lines, ``*.lines``) holds ``lines`` lines."""
    since = time.monotonic()
    while True:
        work = list(files.rglob("*.lines"))
        if work and work[0].read_bytes().count(b"\n") >= lines:
            return
        assert time.monotonic() - since < stall_s, f"not {lines} lines collected in {files}"
        time.sleep(0.05)


def _served(client: openai.OpenAI, stall_s: float = 120.0) -> list[str]:
    """The models listed, once a worker has published what its endpoints serve."""
    since = time.monotonic()
    while not (models := [m.id for m in client.models.list()]):
        assert time.monotonic() - since < stall_s, "no model listed"
        time.sleep(0.1)
    return models


def _slow_fleet(fleet_factory: FleetFactory, *, step_ms: int, seqs: int, batch: int) -> Fleet:
    """One slow endpoint and its worker, two small batches in flight: a batch of hundreds of
    requests runs for seconds, long enough to act on it midway."""
    fleet = fleet_factory(1, "--step-ms", str(step_ms), "--max-num-seqs", str(seqs))
    fleet.worker(
        "w", [0], burst=False, SWARM_BATCH_SIZE=str(batch), SWARM_INFLIGHT_MAX="0",
        SWARM_INFLIGHT="2",
    )  # fmt: skip
    return fleet


def _split_whole(client: openai.OpenAI, over: Any, n: int) -> list[dict[str, Any]]:
    """The error lines of a batch ended early, once its output and error files are checked
    to hold its counts and every request once."""
    counts = over.request_counts
    out, errors = (
        gw.file_lines(client, over.output_file_id),
        gw.file_lines(client, over.error_file_id),
    )
    assert (len(out), len(errors)) == (counts.completed, counts.failed)
    assert sorted(x["custom_id"] for x in out + errors) == sorted(f"req-{i}" for i in range(n))
    return errors


def _chat(i: int) -> dict[str, Any]:
    return {
        "custom_id": f"chat-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "messages": [{"role": "user", "content": f"Summarise finding {i}."}],
            "max_tokens": MAX_TOKENS,
        },
    }


def _chat_answer(i: int) -> str:
    # swarm-sim's stand-in chat template around the one user message
    seen = f"<|user|>\nSummarise finding {i}.\n<|assistant|>\n"
    return completion_for(seen, MAX_TOKENS)[0].lstrip()


def _float32(values: list[float]) -> list[float]:
    return unpack_vector(pack_vector(values))


def test_batches_of_each_endpoint_through_the_sdk_are_answered_line_by_line(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = fleet_factory(2)
    fleet.worker("w", [0, 1], burst=False)
    poison = {3, 77}
    n = 200
    with gw.gateway(fleet.env, tmp_path) as (_, port, log):
        client = gw.client(port)
        lines = [gw.completion_line(i, poison) for i in range(n)]
        completions = client.batches.create(
            input_file_id=gw.upload(client, tmp_path, "c.jsonl", lines),
            endpoint="/v1/completions",
            completion_window="24h",
            metadata={"study": "survey"},
        )
        assert completions.status == "validating"
        chat = client.batches.create(
            input_file_id=gw.upload(client, tmp_path, "chat.jsonl", [_chat(i) for i in range(30)]),
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
        texts = [f"Observation {i} of the embedding survey." for i in range(20)]
        embed_lines = [
            {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": t}}
            for i, t in enumerate(texts)
        ]
        embeddings = client.batches.create(
            input_file_id=gw.upload(client, tmp_path, "e.jsonl", embed_lines),
            endpoint="/v1/embeddings",
            completion_window="24h",
        )

        done = gw.wait_over(client, completions.id)
        assert done.status == "completed"
        assert done.metadata == {"study": "survey"}
        assert (done.request_counts.total, done.request_counts.completed) == (n, n - 2)
        assert done.request_counts.failed == 2
        assert done.in_progress_at and done.finalizing_at and done.completed_at
        out = gw.file_lines(client, done.output_file_id)
        assert sorted(x["custom_id"] for x in out) == sorted(
            f"req-{i}" for i in range(n) if i not in poison
        )
        for x in out:
            i = int(x["custom_id"].split("-")[1])
            assert x["error"] is None
            assert x["response"]["status_code"] == 200
            body = x["response"]["body"]
            assert body["object"] == "text_completion"
            prompt = fleet_prompt(i, poison)
            assert body["choices"][0]["text"] == completion_for(prompt, MAX_TOKENS)[0]
            # Each line its own request's usage, as OpenAI writes it, though prompts shared
            # list requests (vLLM counts a list's total only: a batch asks for token ids).
            answer_tokens = completion_for(prompt, MAX_TOKENS)[1]
            assert body["usage"] == {
                "prompt_tokens": count_tokens(prompt), "completion_tokens": answer_tokens,
                "total_tokens": count_tokens(prompt) + answer_tokens,
                "prompt_tokens_details": None, "completion_tokens_details": None,
            }  # fmt: skip
        # The batch's usage is what the server counted for its answered requests, exactly.
        answered = [fleet_prompt(i, poison) for i in range(n) if i not in poison]
        assert done.usage is not None
        assert (done.usage.input_tokens, done.usage.output_tokens) == (
            sum(map(count_tokens, answered)),
            sum(completion_for(p, MAX_TOKENS)[1] for p in answered),
        )
        assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
        errors = gw.file_lines(client, done.error_file_id)
        assert sorted(x["custom_id"] for x in errors) == ["req-3", "req-77"]
        for x in errors:
            assert x["response"]["status_code"] == 400
            assert x["error"]["message"].startswith(OVER_CONTEXT)

        chat_done = gw.wait_over(client, chat.id)
        assert chat_done.status == "completed" and chat_done.error_file_id is None
        chat_out = gw.file_lines(client, chat_done.output_file_id)
        assert len(chat_out) == 30
        for x in chat_out:
            i = int(x["custom_id"].split("-")[1])
            message = x["response"]["body"]["choices"][0]["message"]
            assert message == {"role": "assistant", "content": _chat_answer(i)}

        embed_done = gw.wait_over(client, embeddings.id)
        assert embed_done.status == "completed"
        embedded = gw.file_lines(client, embed_done.output_file_id)
        vectors = {x["custom_id"]: x["response"]["body"]["data"][0]["embedding"] for x in embedded}
        assert vectors == {f"e{i}": _float32(embedding_for(t)) for i, t in enumerate(texts)}
        tokens = {x["custom_id"]: x["response"]["body"]["usage"]["prompt_tokens"] for x in embedded}
        assert tokens == {f"e{i}": count_tokens(t) for i, t in enumerate(texts)}
        assert embed_done.usage is not None
        assert embed_done.usage.input_tokens == sum(map(count_tokens, texts))

        # Newest first, a page at a time, as the SDK pages them.
        page = client.batches.list(limit=2)
        assert [b.id for b in page.data] == [embeddings.id, chat.id] and page.has_more
        assert [b.id for b in client.batches.list(limit=2)] == [
            embeddings.id,
            chat.id,
            completions.id,
        ]
        names = {f.filename for f in client.files.list()}
        assert {"c.jsonl", "chat.jsonl", "e.jsonl", f"{completions.id}_output.jsonl"} <= names
        # What the live endpoints serve, once their worker has published its fleet rows.
        assert _served(client) == ["swarm-sim"]
        # Each batch's request counts were said once, by one driver.
        assert log.read_text().count(f"batch {completions.id}: completed") == 1
        # Nothing of the batches' collection is left beside their files.
        assert not list((tmp_path / "files").rglob("*.lines*"))


def test_an_input_that_fails_validation_fails_the_batch_naming_each_line(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    with gw.gateway(cli_env, tmp_path) as (_, port, _log):
        client = gw.client(port)
        good = gw.completion_line(0, set())
        good["body"]["model"] = "m1"
        dup = gw.completion_line(1, set()) | {"custom_id": "req-0"}
        other_url = gw.completion_line(2, set()) | {"url": "/v1/chat/completions"}
        other_model = gw.completion_line(3, set())
        other_model["body"]["model"] = "m2"
        lines = [good, "{not json", other_url, dup, other_model, gw.completion_line(5, set())]
        batch = client.batches.create(
            input_file_id=gw.upload(client, tmp_path, "bad.jsonl", lines),
            endpoint="/v1/completions",
            completion_window="24h",
        )
        failed = gw.wait_over(client, batch.id)
        assert failed.status == "failed" and failed.failed_at
        assert failed.errors is not None
        assert [(e.line, e.code, e.param) for e in failed.errors.data] == [
            (2, "invalid_json_line", None),
            (3, "url_mismatch", "url"),
            (4, "duplicate_custom_id", "custom_id"),
            (5, "model_mismatch", "body.model"),
        ]
        assert failed.output_file_id is None and failed.request_counts.total == 0

        empty = client.batches.create(
            input_file_id=gw.upload(client, tmp_path, "empty.jsonl", []),
            endpoint="/v1/completions",
            completion_window="24h",
        )
        assert [e.code for e in gw.wait_over(client, empty.id).errors.data] == ["empty_file"]

        file_id = gw.upload(client, tmp_path, "ok.jsonl", [good])
        with pytest.raises(openai.BadRequestError) as bad:
            client.batches.create(
                input_file_id=file_id,
                endpoint="/v1/moderations",
                completion_window="24h",
            )
        assert bad.value.status_code == 400
        assert "endpoint '/v1/moderations' is not supported" in bad.value.message
        with pytest.raises(openai.BadRequestError, match="completion_window"):
            client.batches.create(
                input_file_id=file_id,
                endpoint="/v1/completions",
                completion_window="soon",
            )
        for missing in ("batch_" + "0" * 24, "../../etc"):
            with pytest.raises(openai.NotFoundError) as gone:
                client.batches.retrieve(missing)
            assert gone.value.body == {  # OpenAI's error shape
                "message": f"No such Batch object: {missing}",
                "type": "invalid_request_error",
                "param": None,
                "code": "not_found",
            }


def test_two_projects_on_one_gateway_see_nothing_of_each_other(
    cli_env: dict[str, str], tmp_path: Path, redis_url: str
) -> None:
    alpha_key, beta_key = "sk-alpha-0123456789abcdef", "sk-beta-0123456789abcdef"
    beta_prefix = cli_env["SWARM_PREFIX"] + "-beta"  # beta's jobs under a prefix of its own
    keys = tmp_path / "keys"
    keys.write_text(f"# key project\n{alpha_key} alpha\n{beta_key} beta {beta_prefix}\n")
    with gw.gateway(cli_env, tmp_path, "--keys", str(keys)) as (_, port, log):
        alpha, beta = gw.client(port, alpha_key), gw.client(port, beta_key)
        file_id = gw.upload(alpha, tmp_path, "a.jsonl", [gw.completion_line(0, set())])
        batch = alpha.batches.create(
            input_file_id=file_id, endpoint="/v1/completions", completion_window="24h"
        )
        assert [b.id for b in alpha.batches.list()] == [batch.id]
        assert beta.batches.list().data == [] and beta.files.list().data == []
        for call in (
            lambda: beta.batches.retrieve(batch.id),
            lambda: beta.batches.cancel(batch.id),
            lambda: beta.files.retrieve(file_id),
            lambda: beta.files.content(file_id),
            lambda: beta.files.delete(file_id),
            lambda: beta.batches.create(
                input_file_id=file_id, endpoint="/v1/completions", completion_window="24h"
            ),
        ):
            with pytest.raises(openai.NotFoundError):
                call()
        assert alpha.files.retrieve(file_id).id == file_id  # still there for its owner
        for wrong in ("no-key", beta_key + "x"):
            with pytest.raises(openai.AuthenticationError):
                gw.client(port, wrong).batches.list()
        # Each project's job under its own prefix, once queued (no worker runs them here).
        theirs = beta.batches.create(
            input_file_id=gw.upload(beta, tmp_path, "b.jsonl", [gw.completion_line(0, set())]),
            endpoint="/v1/completions",
            completion_window="24h",
        )
        prefixes = (cli_env["SWARM_PREFIX"], beta_prefix)
        r = sync_client(redis_url)
        try:
            for batch_id, mine, other in (
                (batch.id, prefixes[0], prefixes[1]),
                (theirs.id, prefixes[1], prefixes[0]),
            ):
                since = time.monotonic()
                while not r.exists(Keys(mine).meta(batch_id)):
                    assert time.monotonic() - since < 60, f"{batch_id} never queued under {mine}"
                    time.sleep(0.05)
                assert not r.exists(Keys(other).meta(batch_id))
        finally:
            r.close()
        # No worker runs under beta's prefix: its batch says so while it runs, never silent.
        since = time.monotonic()
        while (running := beta.batches.retrieve(theirs.id)).status != "in_progress":
            assert time.monotonic() - since < 60, running.status
            time.sleep(0.05)
        assert running.waiting == (  # type: ignore[attr-defined]
            f"no live worker serves this project's prefix {beta_prefix!r} (SWARM_PREFIX)"
        )
        # A file deleted is gone for its owner too.
        assert alpha.files.delete(file_id).deleted
        with pytest.raises(openai.NotFoundError):
            alpha.files.retrieve(file_id)
        said = log.read_text()
    assert alpha_key not in said and beta_key not in said


def test_without_keys_the_gateway_serves_this_host_only(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    out = subprocess.run(
        [BIN / "swarm-gateway", "--bind", "0.0.0.0", "--port", str(free_port()), "--dir", tmp_path],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "with no API keys (SWARM_GATEWAY_KEYS) the gateway serves this host only" in out.stderr


def _form(*files: tuple[str, bytes]) -> tuple[bytes, str]:
    """A multipart upload of ``files`` (name, bytes) written out by hand, any name as is (a
    client library refuses a NUL in one), and its content type."""
    parts = [b'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch']
    parts += [
        b'Content-Disposition: form-data; name="file"; filename="' + name.encode() + b'"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n" + data
        for name, data in files
    ]
    body = b"".join(b"--sq\r\n" + p + b"\r\n" for p in parts) + b"--sq--\r\n"
    return body, "multipart/form-data; boundary=sq"


async def test_every_refusal_is_in_openais_error_shape_and_leaves_no_bytes_behind(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Seen: a non-multipart upload, a NUL or 8 KB filename answered HTTP 500 "Server got
    itself in trouble"; an unknown route, 405 and 413 in plain text; two file parts in one
    upload left the first's bytes on disk, listed nowhere; metadata over OpenAI's 64/512
    characters taken."""
    with gw.gateway(cli_env, tmp_path) as (_, port, _log):
        base = f"http://127.0.0.1:{port}/v1"
        asks: list[tuple[str, str, tuple[bytes, str] | None]] = [
            ("GET", "/nothing-here", None),
            ("DELETE", "/batches", None),
            ("POST", "/files", (b'{"purpose": "batch"}', "application/json")),
            ("POST", "/files", _form(("a\x00b.jsonl", b"{}\n"))),
            ("POST", "/files", _form(("x" * 8192 + ".jsonl", b"{}\n"))),
            ("POST", "/files", _form(("a.jsonl", b"{}\n"), ("b.jsonl", b"{}\n"))),
        ]
        answers = []
        async with aiohttp.ClientSession() as http:
            for method, path, sent in asks:
                body, kind = sent or (None, "")
                headers = {"Content-Type": kind} if kind else {}
                async with http.request(method, base + path, data=body, headers=headers) as resp:
                    answers.append((resp.status, await resp.json(content_type=None)))
        assert [status for status, _ in answers] == [404, 405, 400, 400, 400, 400]
        for _, body in answers:
            error = body["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert answers[5][1]["error"]["message"] == "one file per upload"
        client = gw.client(port)
        file_id = gw.upload(client, tmp_path, "in.jsonl", [gw.completion_line(0, set())])
        for metadata in ({"k" * 65: "v"}, {"k": "v" * 513}):
            with pytest.raises(openai.BadRequestError, match="at most 64 characters"):
                await asyncio.to_thread(
                    client.batches.create, input_file_id=file_id, endpoint="/v1/completions",
                    completion_window="24h", metadata=metadata,
                )  # fmt: skip
        listed = await asyncio.to_thread(lambda: client.files.list().data)
        assert [f.id for f in listed] == [file_id]
    kept = [p.name for p in (tmp_path / "files").rglob("*") if p.is_file()]
    assert kept == [file_id]


def test_a_cancelled_batch_keeps_what_was_answered_and_fails_the_rest(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = _slow_fleet(fleet_factory, step_ms=30, seqs=16, batch=8)
    n = 300
    with gw.gateway(fleet.env, tmp_path) as (_, port, _log):
        client = gw.client(port)
        batch = gw.completions_batch(client, tmp_path, n)
        gw.wait_answered(client, batch.id, 16)
        asked = client.batches.cancel(batch.id)
        assert asked.status == "cancelling" and asked.cancelling_at
        over = gw.wait_over(client, batch.id)
        assert over.status == "cancelled" and over.cancelled_at
        counts = over.request_counts
        assert counts.total == n and counts.completed + counts.failed == n
        assert 16 <= counts.completed < n
        errors = _split_whole(client, over, n)
        # As OpenAI writes a request its batch's cancel stopped: no response, its own code.
        assert {(x["response"] is None, x["error"]["code"]) for x in errors} == {
            (True, "batch_cancelled")
        }
        assert {x["error"]["message"] for x in errors} == {
            "the batch was cancelled (batches.cancel)"
        }
        with pytest.raises(openai.ConflictError):
            client.batches.cancel(batch.id)


def test_a_batch_still_running_at_the_end_of_its_window_expires_with_what_it_has(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    # 8 prompts at a time, 12 steps of 40 ms each: the 400 take about 25 s, and a window of
    # 8 s ends with some answered even on a loaded machine (3 s, under --cpu-stress 4, was
    # seen to end with none: the window passed before the first batch came back).
    fleet = _slow_fleet(fleet_factory, step_ms=40, seqs=8, batch=4)
    n = 400
    with gw.gateway(fleet.env, tmp_path) as (_, port, _log):
        client = gw.client(port)
        _served(client)  # the worker is up: the window is the batch's, not its start's
        batch = gw.completions_batch(client, tmp_path, n, window="8s")
        assert batch.expires_at == batch.created_at + 8
        over = gw.wait_over(client, batch.id)
        assert over.status == "expired" and over.expired_at and over.expired_at >= batch.expires_at
        counts = over.request_counts
        assert 0 < counts.completed < n and counts.completed + counts.failed == n
        errors = _split_whole(client, over, n)
        assert {(x["response"] is None, x["error"]["code"]) for x in errors} == {
            (True, "batch_expired")
        }
        assert {x["error"]["message"] for x in errors} == {
            "the batch expired: its completion window (8s) ended before this request was answered"
        }


def test_a_batch_whose_job_is_deleted_under_it_fails_saying_so_and_is_not_queued_again(
    fleet_factory: FleetFactory, tmp_path: Path, redis_url: str
) -> None:
    fleet = _slow_fleet(fleet_factory, step_ms=30, seqs=16, batch=8)
    n = 300
    with gw.gateway(fleet.env, tmp_path) as (_, port, _log):
        client = gw.client(port)
        batch = gw.completions_batch(client, tmp_path, n)
        gw.wait_answered(client, batch.id, 16)
        # Answered is not yet collected (the collector writes in input order): wait for
        # 16 lines in the batch's work file, the answers its deletion must not lose.
        _wait_collected(tmp_path / "files", 16)
        gone = subprocess.run(
            [BIN / "swarm-jobs", "--delete", batch.id, "--force"],
            env=fleet.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert gone.returncode == 0, gone.stderr
        over = gw.wait_over(client, batch.id)
        assert over.status == "failed" and over.errors is not None
        assert [e.code for e in over.errors.data] == ["job_deleted"]
        answered = gw.file_lines(client, over.output_file_id)
        assert len(answered) >= 16 and all(x["error"] is None for x in answered)
        # What it says it answered is what its output file holds (it said 0 before).
        assert over.request_counts.completed == len(answered)
        assert [x["custom_id"] for x in answered] == [f"req-{i}" for i in range(len(answered))]
        # Nothing of its collection left beside its files (before, the lock file of the
        # collector its job's deletion stopped).
        assert not list((tmp_path / "files").rglob("*.lines*"))
        r = sync_client(redis_url)
        try:  # over: never queued again behind its user's back
            assert not r.exists(Keys(fleet.prefix).meta(batch.id))
        finally:
            r.close()


def test_a_gateway_killed_mid_batch_is_carried_on_by_the_next_one(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    fleet = fleet_factory(2, "--step-ms", "20", "--max-num-seqs", "32")
    fleet.worker("w", [0, 1], burst=False, SWARM_BATCH_SIZE="16")
    n = 600
    with gw.gateway(fleet.env, tmp_path) as (first, port, _log):
        client = gw.client(port)
        batch = gw.completions_batch(client, tmp_path, n)
        seen = gw.wait_answered(client, batch.id, 64)
        assert seen.status == "in_progress"
        helpers = gw.children(first.pid)
        assert len(helpers) >= 2  # its helpers (and the resource tracker) are running
        first.send_signal(signal.SIGKILL)
        first.wait()
        deadline = time.monotonic() + 15
        while (left := [h for h in helpers if gw.alive(h)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left == [], "the gateway's helper processes outlived it"
    with gw.gateway(fleet.env, tmp_path) as (_, port, _log):
        client = gw.client(port)
        done = gw.wait_over(client, batch.id)
        assert done.status == "completed", done
        assert (done.request_counts.completed, done.request_counts.failed) == (n, 0)
        out = gw.file_lines(client, done.output_file_id)
    got = {x["custom_id"]: x["response"]["body"]["choices"][0]["text"] for x in out}
    assert len(out) == n  # each line once
    assert got == {
        f"req-{i}": completion_for(fleet_prompt(i, set()), MAX_TOKENS)[0] for i in range(n)
    }


def test_a_batch_whose_input_is_deleted_completes_from_what_it_holds_through_a_restart(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    """Seen: 20,000 of 20,000 answered, the batch ``in_progress`` for good and
    ``No such file ... (tried again in 5 s)`` every 5 s: its input deleted (OpenAI allows it
    for a running batch), then its gateway killed and started again. A job queued whole needs
    its input no more."""
    fleet = fleet_factory(2, "--step-ms", "20", "--max-num-seqs", "32")
    fleet.worker("w", [0, 1], burst=False, SWARM_BATCH_SIZE="16")
    n = 400
    with gw.gateway(fleet.env, tmp_path) as (first, port, _log):
        client = gw.client(port)
        batch = gw.completions_batch(client, tmp_path, n)
        assert gw.wait_answered(client, batch.id, 32).status == "in_progress"
        assert client.files.delete(batch.input_file_id).deleted
        first.send_signal(signal.SIGKILL)
        first.wait()
    with gw.gateway(fleet.env, tmp_path) as (_, port, log):
        client = gw.client(port)
        done = gw.wait_over(client, batch.id, stall_s=60)
        assert done.status == "completed", (done, log.read_text()[-3000:])
        assert (done.request_counts.completed, done.request_counts.failed) == (n, 0)
        out = gw.file_lines(client, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(f"req-{i}" for i in range(n))


def test_the_batch_objects_decode_as_the_sdk_types_them() -> None:
    """What the gateway serves is what openai's own types read, field for field."""
    from swarm_queue.common.batchapi import (
        BatchError,
        BatchErrors,
        BatchObject,
        BatchStatus,
        BatchUsage,
        ExpiresAfter,
        InputTokensDetails,
        OutputTokensDetails,
        json_body,
    )

    obj = BatchObject(
        id="batch_" + "a" * 24, endpoint="/v1/completions", input_file_id="file-" + "b" * 24,
        completion_window="24h", status=BatchStatus.IN_PROGRESS, created_at=1, expires_at=2,
    )  # fmt: skip
    typed = openai.types.Batch.model_validate(msgspec.json.decode(json_body(obj)))
    assert typed.status == "in_progress" and typed.request_counts is not None
    assert typed.request_counts.total == 0
    # Every field filled: each one the SDK's, of its type (its BatchUsage requires both
    # details: a usage without them, as served before, fails here).
    full = msgspec.structs.replace(
        obj,
        errors=BatchErrors([BatchError("deadline_at_risk", "late", line=3)]),
        usage=BatchUsage(10, InputTokensDetails(4), 6, OutputTokensDetails(2), 16),
        metadata={"k": "v"},
        model="m",
        output_expires_after=ExpiresAfter("created_at", 3600),
        waiting=None,
    )
    raw = msgspec.json.decode(json_body(full))
    strict = openai.types.Batch.model_validate(raw, strict=False)
    assert strict.usage is not None
    assert strict.usage.input_tokens_details.cached_tokens == 4
    assert strict.usage.output_tokens_details.reasoning_tokens == 2
    # Beside the SDK's fields: swarm-queue's own `waiting`, and the `output_expires_after` the
    # batch was created with (a create parameter in the SDK, echoed back), kept as extras.
    assert strict.model_extra == {
        "output_expires_after": {"anchor": "created_at", "seconds": 3600},
        "waiting": None,
    }
    assert set(raw) - {"waiting", "output_expires_after"} <= set(openai.types.Batch.model_fields)
    for part, sdk in ((raw["usage"], openai.types.BatchUsage),):
        required = {n for n, f in sdk.model_fields.items() if f.is_required()}
        assert required <= set(part), required - set(part)


def test_batches_of_two_models_beside_a_command_line_job_and_a_broken_endpoint(
    fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    """The shared case: one fleet serving two models, one endpoint unusable (a wrong key), a
    job queued from the command line beside two gateway batches: each answered by its own
    model's endpoint, line by line, and nothing stopped by the broken one."""
    fleet = fleet_factory(2, "--model", "writer,coder")
    with wrong_key_endpoint() as broken:
        endpoints = f"{fleet.url(0)},{fleet.url(1)},{broken}"
        fleet.worker("w", [0, 1], burst=False, SWARM_ENDPOINTS=endpoints)
        n = 120
        source = tmp_path / "cli.txt"
        source.write_text("".join(fleet_prompt(i, set()) + "\n" for i in range(n)))
        cli = subprocess.run(
            [BIN / "swarm-enqueue", source, "--job", "beside", "--model", "writer",
             "--max-tokens", str(MAX_TOKENS)],
            env=fleet.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        with gw.gateway(fleet.env, tmp_path) as (_, port, _log):
            client = gw.client(port)
            batches = {}
            for model in ("writer", "coder"):
                lines = [gw.completion_line(i, set()) for i in range(n)]
                for line in lines:
                    line["body"]["model"] = model
                batches[model] = client.batches.create(
                    input_file_id=gw.upload(client, tmp_path, f"{model}.jsonl", lines),
                    endpoint="/v1/completions",
                    completion_window="24h",
                ).id
            for model, batch_id in batches.items():
                done = gw.wait_over(client, batch_id)
                assert done.status == "completed" and done.model == model
                assert done.error_file_id is None
                out = gw.file_lines(client, done.output_file_id)
                assert sorted(x["custom_id"] for x in out) == sorted(f"req-{i}" for i in range(n))
                for x in out:
                    i = int(x["custom_id"].split("-")[1])
                    body = x["response"]["body"]
                    assert body["model"] == model  # its own model's endpoint answered it
                    expected = completion_for(fleet_prompt(i, set()), MAX_TOKENS)[0]
                    assert body["choices"][0]["text"] == expected
        collected = collect(fleet.env, "beside", tmp_path / "beside.jsonl")
        assert collected.returncode == 0, collected.stderr
        check_output(tmp_path / "beside.jsonl", n, set())


def test_a_clean_batch_s_work_file_becomes_its_output_file_and_a_rerun_finds_it(
    tmp_path: Path,
) -> None:
    """A batch with no failed request: its work file is renamed to the output file, not
    copied; the driver of a gateway that died right after the rename finds the output file
    in place (a rerun that looked for the work file alone would write empty files)."""
    from swarm_queue.producer.gateway.workfile import rename_whole as _whole

    work = tmp_path / "b.lines"
    lines = b'{"id": "1", "custom_id": "a"}\n{"id": "2", "custom_id": "b"}\n'
    work.write_bytes(lines)
    out = {"output": tmp_path / "file-out", "error": tmp_path / "file-err"}
    assert _whole(work, out) == {"output": len(lines), "error": 0}
    assert _whole(work, out) == {"output": len(lines), "error": 0}
    assert out["output"].read_bytes() == lines and not work.exists()
    assert not out["error"].exists()
