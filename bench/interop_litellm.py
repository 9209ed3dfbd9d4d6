"""Interop check: a job served by an independent OpenAI-compatible server (LiteLLM's proxy).

LiteLLM's proxy is a separate implementation of the OpenAI wire format: its own request parsing,
its own response models, its own error bodies (``"code": "400"``, ``"type": null``). It forwards
list prompts to an upstream ``/v1/completions``; here that upstream is swarm-sim, so every text
can still be checked. The job goes through the real command lines and ``arq`` worker processes.

    python bench/interop_litellm.py [--prompts 20000]

LiteLLM is installed into ``bench/out/litellm-venv`` on first use (about 750 MB, a minute),
never into the project's environment. Exit status 0 when every guarantee held.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarm_queue.common.embedded import EmbeddedRedis, free_port
from swarm_queue.sim.text import completion_for

OUT = Path(__file__).resolve().parent / "out" / "interop"
VENV = Path(__file__).resolve().parent / "out" / "litellm-venv"
BIN = Path(sys.executable).parent
POISON = {7, 4242, 9999, 15000, 19999}


def _litellm() -> Path:
    exe = VENV / "bin" / "litellm"
    if not exe.exists():
        print(f"installing litellm[proxy] into {VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([VENV / "bin" / "pip", "install", "-q", "litellm[proxy]"], check=True)
    return exe


def _wait_http(url: str, headers: dict[str, str], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=20_000)
    args = p.parse_args()
    n = args.prompts
    OUT.mkdir(parents=True, exist_ok=True)
    litellm = _litellm()
    key = "sk-" + secrets.token_hex(16)
    sim_port, gw_port = free_port(), free_port()
    (OUT / "litellm.yaml").write_text(
        "model_list:\n"
        "  - model_name: gateway-model\n"
        "    litellm_params:\n"
        "      model: text-completion-openai/swarm-sim\n"
        f"      api_base: http://127.0.0.1:{sim_port}/v1\n"
        "      api_key: EMPTY\n"
        "litellm_settings:\n"
        "  num_retries: 0\n"
    )
    poison = {i for i in POISON if i < n}
    with open(OUT / "prompts.jsonl", "w") as fh:
        for i in range(n):
            prompt = (
                "x" * 20_000 if i in poison else f"prompt number {i}: tell me about item {i * 7}"
            )
            fh.write(json.dumps({"prompt": prompt, "custom_id": f"r{i}"}) + "\n")
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []

    def log(name: str) -> IO[bytes]:
        logs.append(open(OUT / name, "wb"))  # noqa: SIM115 - closed in the finally below
        return logs[-1]

    with EmbeddedRedis() as redis_server:
        env = {**os.environ, "SWARM_REDIS_URL": redis_server.url}
        try:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "swarm_queue.sim", "--ports", str(sim_port)],
                    stdout=log("sim.log"),
                    stderr=subprocess.STDOUT,
                )
            )
            procs.append(
                subprocess.Popen(
                    [
                        litellm,
                        "--config",
                        OUT / "litellm.yaml",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(gw_port),
                    ],
                    env={**env, "LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
                    stdout=log("litellm.log"),
                    stderr=subprocess.STDOUT,
                )
            )
            _wait_http(f"http://127.0.0.1:{gw_port}/v1/models", {"Authorization": f"Bearer {key}"})
            t0 = time.monotonic()
            subprocess.run(
                [
                    BIN / "swarm-enqueue",
                    OUT / "prompts.jsonl",
                    "--job",
                    "interop",
                    "--model",
                    "gateway-model",
                    "--max-tokens",
                    "24",
                ],
                env=env,
                check=True,
            )
            workers = []
            for w in range(2):
                wenv = {
                    **env,
                    "SWARM_API_KEY": key,
                    "SWARM_WORKER_NAME": f"interop-{w}",
                    "SWARM_ENDPOINTS": f"http://127.0.0.1:{gw_port}",
                }
                workers.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "arq",
                            "swarm_queue.worker.WorkerSettings",
                            "--burst",
                        ],
                        env=wenv,
                        stdout=log(f"worker-{w}.log"),
                        stderr=subprocess.STDOUT,
                    )
                )
            collected = subprocess.run(
                [BIN / "swarm-collect", "interop", "--out", OUT / "results.jsonl", "--wait"],
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )
            wall = time.monotonic() - t0
            codes = [w.wait(timeout=120) for w in workers]
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=30)
            for handle in logs:
                handle.close()
    prompts = [
        json.loads(line)["prompt"] for line in (OUT / "prompts.jsonl").read_text().splitlines()
    ]
    lines = [json.loads(line) for line in (OUT / "results.jsonl").read_text().splitlines()]
    in_order = [x["index"] for x in lines] == list(range(n))
    correct = sum(
        1
        for x in lines
        if x["error"] is None
        and x["text"] == completion_for(prompts[x["index"]], 24)[0]
        and x["custom_id"] == f"r{x['index']}"
    )
    failed = {x["index"] for x in lines if x["error"]}
    messages_ok = all("maximum input length" in lines[i]["error"] for i in failed)
    leaked = any(key in (OUT / f"worker-{w}.log").read_text() for w in range(2))
    checks = {
        f"{n} lines in input order": len(lines) == n and in_order,
        f"{n - len(poison)} texts correct": correct == n - len(poison),
        f"exactly the {len(poison)} over-long prompts failed, with the server's message": failed
        == poison
        and messages_ok,
        "collect exit status 1 (failures present)": collected.returncode == (1 if poison else 0),
        "both workers exit 0": codes == [0, 0],
        "API key never logged": not leaked,
    }
    print(f"\ninterop with LiteLLM proxy: {n} prompts in {wall:.1f} s ({n / wall:,.0f} prompts/s)")
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
