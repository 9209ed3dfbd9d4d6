"""``swarm-gateway``'s HTTP routes: OpenAI's ``/v1/files``, ``/v1/batches`` and ``/v1/models``,
answered in OpenAI's shapes (the official SDK is the client), from Redis and the files'
directory alone, so any number of gateway processes serve one fleet.

Every request names its project by its key (``Authorization: Bearer KEY``); another project's
id answers 404, exactly as an id that does not exist. Errors are OpenAI's error body.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from swarm_queue.common.batchapi import (
    ENDPOINTS,
    BatchObject,
    BatchStatus,
    ExpiresAfter,
    FileObject,
    api_error,
    epoch_s,
    expiry_s,
    json_body,
    new_id,
    valid_id,
    window_s,
)
from swarm_queue.common.errors import (
    BadRecordError,
    ConfigError,
    JobNotFoundError,
    StoreUnavailable,
    StoreUnreached,
)
from swarm_queue.common.fleet import live_models, waiting_reason
from swarm_queue.common.store import JobStore
from swarm_queue.common.store.batches import StoredBatch
from swarm_queue.producer.gateway.asjob import counts_of, late, usage_of
from swarm_queue.producer.gateway.files import FileStore
from swarm_queue.producer.gateway.projects import Project, Projects

__all__ = ["ApiError", "Gateway", "make_app"]

log = logging.getLogger("swarm.gateway")

# Bytes read from an upload at a time: what an upload costs the gateway's memory.
CHUNK = 1 << 16
# OpenAI's bounds on a batch's metadata and a list page.
MAX_METADATA = 16
MAX_METADATA_KEY = 64  # characters
MAX_METADATA_VALUE = 512  # characters
MAX_LIMIT = 100


class ApiError(Exception):
    """A request answered with OpenAI's error body and ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = api_error(message, type=type, code=code, param=param)


# A file's name as OpenAI's files keep it: bytes of it, at most.
MAX_FILENAME_BYTES = 255


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=json_body(obj), status=status, content_type="application/json")


def _not_found(kind: str, object_id: str) -> ApiError:
    return ApiError(404, f"No such {kind} object: {object_id}", code="not_found")


class Gateway:
    """The routes' state: the store (the gateway's prefix: the batches' records), the jobs'
    stores by prefix, the files, who may call."""

    def __init__(
        self,
        store: JobStore,
        jobs_of: Callable[[str], JobStore],
        files: FileStore,
        projects: Projects,
        created: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.jobs_of = jobs_of
        self.files = files
        self.projects = projects
        self.created = created  # a batch was created: its driver may start it at once

    # -- files ---------------------------------------------------------------------------

    async def upload(self, request: web.Request) -> web.Response:
        project = _project(request)
        if not request.content_type.startswith("multipart/"):
            raise ApiError(400, "expected a multipart/form-data upload of file and purpose")
        reader = await request.multipart()
        purpose: str | None = None
        got: FileObject | None = None
        expiry: dict[str, str] = {}  # (the SDK's expires_after, as form fields)
        try:
            async for part in reader:
                if not isinstance(part, BodyPartReader):
                    continue
                if part.name == "purpose":
                    purpose = (await part.text()).strip()
                elif part.name in ("expires_after[anchor]", "expires_after[seconds]"):
                    field = part.name.removeprefix("expires_after[").removesuffix("]")
                    expiry[field] = (await part.text()).strip()
                elif part.name == "file":
                    if got is not None:
                        raise ApiError(400, "one file per upload", param="file")
                    name = part.filename or "upload"
                    if "\x00" in name or len(name.encode()) > MAX_FILENAME_BYTES:
                        why = f"a filename of at most {MAX_FILENAME_BYTES} bytes, without NUL"
                        raise ApiError(400, why, param="file")
                    file_id = new_id("file")
                    size = await self.files.receive(project.name, file_id, _chunks(part))
                    got = FileObject(
                        id=file_id, bytes=size, created_at=epoch_s(), filename=name, purpose="batch"
                    )
        except BaseException:
            if got is not None:  # refused, or failed (a full disk): no bytes left that nobody lists
                self.files.remove(project.name, got.id)
            raise
        if got is None:
            raise ApiError(400, "no file in the request", param="file")
        if purpose != "batch":
            self.files.remove(project.name, got.id)
            raise ApiError(400, f"purpose {purpose!r}: this gateway takes 'batch'", param="purpose")
        if expiry:
            try:
                keep_s = expiry_s(expiry.get("anchor"), expiry.get("seconds"))
            except ConfigError as exc:
                self.files.remove(project.name, got.id)
                raise ApiError(400, str(exc), param="expires_after") from None
            got = msgspec.structs.replace(got, expires_at=got.created_at + keep_s)
        await self.store.put_file(project.name, got)
        log.info("file %s: %d bytes uploaded (project %s)", got.id, got.bytes, project.name)
        return _json(got)

    async def list_files(self, request: web.Request) -> web.Response:
        files = await self.store.files(_project(request).name)
        purpose = request.query.get("purpose")
        data = [f for f in files if purpose in (None, f.purpose) and not _expired(f)]
        return _json(_page(data, has_more=False))

    async def _file(self, request: web.Request) -> tuple[Project, FileObject]:
        project, file_id = _project(request), request.match_info["file_id"]
        found = await self.store.file(project.name, file_id) if valid_id("file", file_id) else None
        if found is None or _expired(found):
            raise _not_found("File", file_id)
        return project, found

    async def get_file(self, request: web.Request) -> web.Response:
        return _json((await self._file(request))[1])

    async def file_content(self, request: web.Request) -> web.StreamResponse:
        project, found = await self._file(request)
        path = self.files.path(project.name, found.id)
        if not path.exists():
            raise ApiError(404, f"the bytes of file {found.id} are gone", code="not_found")
        # Sent from the file as it is read (sendfile where it can): never held in memory.
        return web.FileResponse(path, headers={"Content-Type": "application/octet-stream"})

    async def delete_file(self, request: web.Request) -> web.Response:
        project, found = await self._file(request)
        await self.store.delete_file(project.name, found.id)
        self.files.remove(project.name, found.id)
        return _json({"id": found.id, "object": "file", "deleted": True})

    # -- batches -------------------------------------------------------------------------

    async def create_batch(self, request: web.Request) -> web.Response:
        project = _project(request)
        try:
            body = msgspec.json.decode(await request.read())
        except msgspec.DecodeError:
            raise ApiError(400, "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise ApiError(
                400,
                f"endpoint {endpoint!r} is not supported: one of {', '.join(ENDPOINTS)}",
                param="endpoint",
            )
        window = body.get("completion_window", "24h")
        try:
            seconds = window_s(window)
        except ConfigError as exc:
            raise ApiError(400, str(exc), param="completion_window") from None
        metadata = body.get("metadata")
        if metadata is not None and (
            not isinstance(metadata, dict)
            or len(metadata) > MAX_METADATA
            or not all(
                isinstance(k, str)
                and isinstance(v, str)
                and len(k) <= MAX_METADATA_KEY
                and len(v) <= MAX_METADATA_VALUE
                for k, v in metadata.items()
            )
        ):
            raise ApiError(
                400,
                f"metadata: at most {MAX_METADATA} string keys of at most {MAX_METADATA_KEY} "
                f"characters and values of at most {MAX_METADATA_VALUE}",
                param="metadata",
            )
        expires = body.get("output_expires_after")
        if expires is not None:
            try:
                if not isinstance(expires, dict):
                    raise ConfigError("output_expires_after: an object of anchor and seconds")
                keep_s = expiry_s(expires.get("anchor"), expires.get("seconds"))
            except ConfigError as exc:
                raise ApiError(400, str(exc), param="output_expires_after") from None
            expires = ExpiresAfter("created_at", keep_s)
        file_id = body.get("input_file_id")
        found = (
            await self.store.file(project.name, file_id)
            if isinstance(file_id, str) and valid_id("file", file_id)
            else None
        )
        if found is None:
            raise ApiError(404, f"No such File object: {file_id}", code="not_found")
        now = epoch_s()
        batch = BatchObject(
            id=new_id("batch"), endpoint=endpoint, input_file_id=found.id,
            completion_window=window, status=BatchStatus.VALIDATING, created_at=now,
            expires_at=now + seconds, metadata=metadata, output_expires_after=expires,
        )  # fmt: skip
        await self.store.create_batch(project.name, batch, project.prefix)
        self.created()
        log.info("batch %s: created from %s (project %s)", batch.id, found.id, project.name)
        return _json(batch)

    async def _batch(self, request: web.Request) -> tuple[Project, StoredBatch]:
        project, batch_id = _project(request), request.match_info["batch_id"]
        stored = (
            await self.store.batch(project.name, batch_id) if valid_id("batch", batch_id) else None
        )
        if stored is None:
            raise _not_found("Batch", batch_id)
        return project, stored

    async def view(self, stored: StoredBatch) -> BatchObject:
        """The batch as a caller sees it now: ``cancelling`` once a cancel is asked, and the
        request counts live from its job while it runs, with a note in ``errors`` when at its
        pace it will not finish in its window."""
        batch = stored.batch
        if batch.status.over:
            return batch
        if stored.cancel_at is not None:
            batch = msgspec.structs.replace(
                batch, status=BatchStatus.CANCELLING, cancelling_at=stored.cancel_at
            )
        if stored.batch.status in (BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING):
            jobs = self.jobs_of(stored.prefix)
            try:
                s = await jobs.status(batch.id)
            except JobNotFoundError:
                return batch
            counts = counts_of(s.done, s.failed, s.total or s.enqueued)
            batch = msgspec.structs.replace(
                batch,
                request_counts=counts,
                usage=usage_of(s),
                waiting=await _waiting(jobs, batch),
                errors=late(batch, s, epoch_s()),  # (the clock its window is kept by)
            )
        return batch

    async def get_batch(self, request: web.Request) -> web.Response:
        return _json(await self.view((await self._batch(request))[1]))

    async def list_batches(self, request: web.Request) -> web.Response:
        project = _project(request)
        try:
            limit = int(request.query.get("limit", "20"))
        except ValueError:
            raise ApiError(400, "limit must be a whole number", param="limit") from None
        if not 1 <= limit <= MAX_LIMIT:
            raise ApiError(400, f"limit must be 1 to {MAX_LIMIT}", param="limit")
        ids = await self.store.batch_ids(project.name, request.query.get("after"), limit + 1)
        data = []
        for batch_id in ids[:limit]:
            stored = await self.store.batch(project.name, batch_id)
            if stored is not None:
                data.append(await self.view(stored))
        return _json(_page(data, has_more=len(ids) > limit))

    async def cancel_batch(self, request: web.Request) -> web.Response:
        project, stored = await self._batch(request)
        if stored.batch.status.over:
            raise ApiError(
                409, f"batch {stored.batch.id} is {stored.batch.status.value}: nothing to cancel"
            )
        stored.cancel_at = await self.store.ask_cancel(project.name, stored.batch.id, epoch_s())
        log.info("batch %s: cancel asked (project %s)", stored.batch.id, project.name)
        return _json(await self.view(stored))

    # -- models --------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        _project(request)
        names = live_models(await self.store.read_fleet(), await self.store.server_time())
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "swarm-queue"} for m in names
        ]
        return _json({"object": "list", "data": data})


async def _waiting(jobs: JobStore, batch: BatchObject) -> str | None:
    """Why ``batch``'s requests wait (see :func:`common.fleet.waiting_reason`), naming the
    project's prefix when no worker serves it at all; None when a live endpoint serves it."""
    try:
        fleet, now = await jobs.read_fleet(), await jobs.server_time()
    except BadRecordError:
        return None
    if not live_models(fleet, now):
        return f"no live worker serves this project's prefix {jobs.keys.prefix!r} (SWARM_PREFIX)"
    return waiting_reason(batch.model, fleet, now)


def _expired(file: FileObject) -> bool:
    """Whether ``file``'s expiry has passed (it is deleted within a second or so)."""
    return file.expires_at is not None and file.expires_at <= epoch_s()


def _project(request: web.Request) -> Project:
    project: Project = request["project"]
    return project


def _page(data: list[Any], *, has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0].id if data else None,
        "last_id": data[-1].id if data else None,
        "has_more": has_more,
    }


async def _chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    while chunk := await part.read_chunk(CHUNK):
        yield chunk


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(gateway: Gateway) -> web.Application:
    """The gateway's routes, each behind who-may-call and OpenAI's error bodies."""

    @web.middleware
    async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            project = gateway.projects.project_of(request.headers.get("Authorization"))
            if project is None:
                raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
            request["project"] = project
            return await handler(request)
        except ApiError as exc:
            return web.Response(body=exc.body, status=exc.status, content_type="application/json")
        except (StoreUnavailable, StoreUnreached) as exc:
            log.warning("%s %s: %s", request.method, request.path, exc)
            body = api_error("the gateway's Redis is unavailable; try again", type="server_error")
            return web.Response(body=body, status=503, content_type="application/json")
        except HttpProcessingError as exc:  # a body aiohttp cannot read (a NUL in a header)
            why = (exc.message or type(exc).__name__).strip().splitlines()[0][:200]
            body = api_error(f"unreadable request: {why}", type="invalid_request_error")
            return web.Response(body=body, status=400, content_type="application/json")
        except web.HTTPException as exc:  # aiohttp's own: no such route, method, too large
            if exc.status < 400:
                raise
            body = api_error(exc.reason, type="invalid_request_error")
            return web.Response(body=body, status=exc.status, content_type="application/json")
        except Exception as exc:  # a full disk, a body no handler foresaw: still OpenAI's shape
            log.exception("%s %s failed", request.method, request.path)
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            body = api_error(f"the gateway failed on this request: {why}", type="server_error")
            return web.Response(body=body, status=500, content_type="application/json")

    app = web.Application(middlewares=[openai_errors])
    g = gateway
    app.router.add_post("/v1/files", g.upload)
    app.router.add_get("/v1/files", g.list_files)
    app.router.add_get("/v1/files/{file_id}", g.get_file)
    app.router.add_delete("/v1/files/{file_id}", g.delete_file)
    app.router.add_get("/v1/files/{file_id}/content", g.file_content)
    app.router.add_post("/v1/batches", g.create_batch)
    app.router.add_get("/v1/batches", g.list_batches)
    app.router.add_get("/v1/batches/{batch_id}", g.get_batch)
    app.router.add_post("/v1/batches/{batch_id}/cancel", g.cancel_batch)
    app.router.add_get("/v1/models", g.models)
    return app
