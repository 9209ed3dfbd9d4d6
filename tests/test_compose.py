"""docker-compose.yml and the Dockerfile, checked without a Docker engine: the image holds every
package the entry points need, and every service runs, with the command and environment the
compose file gives it, as a local process (service names mapped to 127.0.0.1 and free ports, the
image's CMD for services without a command). The demo service must finish its job in order."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis
import yaml

from swarm_queue.common.embedded import free_port
from swarm_queue.sim.text import completion_for
from tests.harness import BIN, wait_port
from tests.servers import REDIS_SERVER

REPO = Path(__file__).resolve().parent.parent


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return data["services"]


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of each Dockerfile line."""
    out = []
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            op, _, rest = line.strip().partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def _image_cmd() -> list[str]:
    cmds = [json.loads(rest) for op, rest in _dockerfile() if op == "CMD"]
    assert cmds, "the Dockerfile has no CMD"
    return list(cmds[-1])


def _programs(script: str) -> list[str]:
    """The program each command of a shell ``script`` starts with."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    programs, start = [], True
    for token in lexer:
        if token in ("&&", "||", ";", "|"):
            start = True
        elif start:
            programs.append(token)
            start = False
    return programs


def test_the_image_holds_every_package_and_the_commands_services_run() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    copied = {rest.split()[0] for op, rest in _dockerfile() if op == "COPY"}
    copied |= {p for op, rest in _dockerfile() if op == "COPY" for p in rest.split()[:-1]}
    # swarm_queue/ holds every package of the product.
    wanted = {"swarm_queue", "pyproject.toml", "README.md"}
    assert wanted <= copied, f"not copied into the image: {wanted - copied}"
    scripts = set(pyproject["project"]["scripts"]) | {"arq", "python"}
    for name, service in _compose().items():
        if "build" not in service:
            continue
        command = service.get("command") or _image_cmd()
        if service.get("entrypoint") == ["sh", "-c"]:
            firsts = _programs(command[0])
            assert firsts and set(firsts) <= scripts, f"{name}: runs {set(firsts) - scripts}"
        else:
            assert command[0] in scripts, f"{name}: runs {command[0]}"
        for var in service.get("environment") or {}:
            assert var.startswith("SWARM_"), f"{name}: unexpected variable {var}"


class _Local:
    """The compose services as local processes."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.hosts: dict[str, str] = {}  # "service:port" -> "127.0.0.1:free"

    def env(self, service: dict[str, Any]) -> dict[str, str]:
        e = {k: v for k, v in os.environ.items() if not k.startswith("SWARM_")}
        e["PATH"] = f"{BIN}:{e['PATH']}"
        for key, value in (service.get("environment") or {}).items():
            e[key] = self.rewrite(str(value))
        return e

    def rewrite(self, text: str) -> str:
        for container, local in self.hosts.items():
            text = text.replace(container, local)
        return text

    def volume(self, service: dict[str, Any], text: str) -> str:
        """Container paths of the service's bind mounts -> directories under tmp."""
        for mount in service.get("volumes") or []:
            src, _, dst = mount.partition(":")
            if src.startswith("./"):
                local = self.tmp / src[2:]
                local.mkdir(exist_ok=True)
                text = text.replace(dst, str(local))
        return text

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with (self.tmp / f"{name}.log").open("wb") as log:  # the child keeps its own copy
            self.procs[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]


@pytest.fixture
def local(tmp_path: Path) -> Iterator[_Local]:
    services = _Local(tmp_path)
    yield services
    for proc in services.procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.slow
def test_every_compose_service_runs_and_the_demo_job_finishes_in_order(local: _Local) -> None:
    server = REDIS_SERVER
    if server is None:
        pytest.skip("no redis-server binary")
    services = _compose()

    # redis: the compose command (AOF on), on a free port, its data volume a temporary directory.
    rport = free_port()
    local.hosts["redis:6379"] = f"127.0.0.1:{rport}"
    argv = services["redis"]["command"]
    assert argv[0] == "redis-server"
    data = local.tmp / "redis-data"
    data.mkdir()
    local.start("redis", [server, *argv[1:], "--port", str(rport), "--dir", str(data)], {})
    wait_port(rport, local.procs["redis"])

    # sim: its ports mapped to free ones, the rest of its command as written.
    argv = list(services["sim"]["command"])
    i = argv.index("--ports")
    ports = argv[i + 1].split(",")
    for p in ports:
        local.hosts[f"sim:{p}"] = f"127.0.0.1:{free_port()}"
    argv[i + 1] = ",".join(local.hosts[f"sim:{p}"].split(":")[1] for p in ports)
    local.start(
        "sim", [sys.executable, "-m", "swarm_queue.sim", *argv[1:]], local.env(services["sim"])
    )
    for p in ports:
        wait_port(int(local.hosts[f"sim:{p}"].split(":")[1]), local.procs["sim"])

    workers = [n for n, s in services.items() if "SWARM_ENDPOINTS" in (s.get("environment") or {})]
    assert len(workers) >= 2
    for name in workers:
        cmd = services[name].get("command") or _image_cmd()
        local.start(name, [str(BIN / cmd[0]), *cmd[1:]], local.env(services[name]))

    demo = services["demo"]
    assert demo["entrypoint"] == ["sh", "-c"]
    script = local.volume(demo, local.rewrite(demo["command"][0]))
    run = subprocess.run(
        ["sh", "-c", script], env=local.env(demo), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:] + "".join(local.log(w) for w in workers)
    assert "wrote 5000 of 5000 results (5000 ok, 0 failed)" in run.stderr

    lines = [
        msgspec.json.decode(x)
        for x in (local.tmp / "demo-out" / "results.jsonl").read_bytes().splitlines()
    ]
    assert [x["index"] for x in lines] == list(range(5000))
    assert all(
        x["text"] == completion_for(f"Summarise the function of gene G{x['index']:05d}.", 24)[0]
        for x in lines
    )
    # Both workers took part, each through the endpoints the compose file gave it.
    used = {x["endpoint"] for x in lines}
    assert used == {f"http://{local.hosts[f'sim:{p}']}" for p in ports}

    r = redis.Redis(port=rport)
    try:
        assert r.config_get("appendonly") == {"appendonly": "yes"}
    finally:
        r.close()
    for name in workers:  # `docker compose down`: SIGTERM, then a clean exit
        local.procs[name].send_signal(signal.SIGTERM)
    for name in workers:
        assert local.procs[name].wait(timeout=60) == 0, local.log(name)
