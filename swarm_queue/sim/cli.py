"""``swarm-sim``'s command line: a fleet of simulated vLLM servers, one engine per port, their
models, speeds and fault switches (docs/SIMULATOR.md), served until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import signal
import sys
from collections.abc import Sequence

from swarm_queue.sim import server
from swarm_queue.sim.engine import EngineConfig
from swarm_queue.sim.faults import FaultConfig
from swarm_queue.sim.server import SimEndpoint, SimFleet

__all__ = ["build_fleet", "main"]


def _float_list(text: str, n: int, name: str) -> list[float | None]:
    """``"1,,0.5"`` -> per-port values; one value applies to every port; empty means None."""
    parts = text.split(",")
    if len(parts) == 1:
        parts = parts * n
    if len(parts) != n:
        raise SystemExit(f"swarm-sim: --{name} has {len(parts)} values for {n} ports")
    try:
        return [float(p) if p.strip() else None for p in parts]
    except ValueError:
        raise SystemExit(f"swarm-sim: --{name} must be numbers, got {text!r}") from None


def build_fleet(argv: Sequence[str] | None = None) -> SimFleet:
    about = re.sub(
        r"``([^`]+)``", r"\1", (server.__doc__ or "").split("\n\n")[0]
    )  # without its markup
    p = argparse.ArgumentParser(prog="swarm-sim", description=about)
    p.add_argument("--ports", required=True, help="comma-separated ports, one engine each")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--model",
        default="swarm-sim",
        help="served model name, or one per port (a,b,c); base+adapter serves both names",
    )
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--speed", default="1.0", help="per-port speed factors, e.g. 1,1,1,0.5")
    p.add_argument("--step-ms", type=float, default=10.0, help="decode step base cost (ms)")
    p.add_argument("--step-per-seq-ms", type=float, default=0.05, help="added cost per running seq")
    p.add_argument(
        "--prefill-ms-per-token",
        type=float,
        default=0.0,
        help="step time of each prompt token prefilled, not found in the engine's prefix "
        "cache (default 0: prefill free)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=2048,
        help="tokens one engine step processes at most, decode and prefill (vLLM's)",
    )
    p.add_argument(
        "--prefix-cache-blocks",
        type=int,
        default=16_384,
        help="prompt blocks of 16 tokens each engine's prefix cache keeps",
    )
    p.add_argument("--instant", action="store_true", help="answer at once (overhead benchmarks)")
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="answer every request as if it set vLLM's ignore_eos: exactly max_tokens tokens",
    )
    p.add_argument("--error-rate", default="0", help="fraction of requests answered with HTTP 500")
    p.add_argument("--reset-rate", default="0", help="fraction of connections reset")
    p.add_argument(
        "--fail-on",
        default=None,
        metavar="TEXT",
        help="fail with HTTP 500 every request whose prompts hold TEXT (a poison input, as a "
        "tokenizer error is on vLLM)",
    )
    p.add_argument(
        "--hang-on",
        default=None,
        metavar="TEXT",
        help="never answer a request whose prompts hold TEXT (an engine stuck on one input)",
    )
    p.add_argument("--die-after", default="", help="seconds until a port dies (per port)")
    p.add_argument("--stall-after", default="", help="seconds until a port stalls (per port)")
    p.add_argument(
        "--error-format",
        choices=["nested", "flat"],
        default="nested",
        help="vLLM's current {'error': {...}} body, or the older flat one",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--bos-token",
        default="",
        help="the tokenizer's BOS text (default none); /v1/completions adds it unless the "
        "request sends add_special_tokens false, as vLLM does",
    )
    p.add_argument(
        "--chat-template-bos",
        action="store_true",
        help="the model's chat template starts with the BOS (as {{ bos_token }} templates do)",
    )
    p.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="as vLLM's: chat and completion usage say the prompt tokens found in the prefix "
        "cache (prompt_tokens_details.cached_tokens; a completion list's: its last prompt's)",
    )
    p.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="as vLLM's: let the model decide to call tools (tool_choice auto); needs "
        "--tool-call-parser",
    )
    p.add_argument("--tool-call-parser", default=None, help="as vLLM's (any name: hermes...)")
    p.add_argument(
        "--runner",
        choices=["auto", "generate", "pooling"],
        default="auto",
        help="as vLLM's: generate has no /v1/embeddings, pooling no generation routes "
        "(default: every route)",
    )
    a = p.parse_args(argv)
    if a.enable_auto_tool_choice and a.tool_call_parser is None:
        raise SystemExit(
            "swarm-sim: --enable-auto-tool-choice needs --tool-call-parser, as in vLLM"
        )
    try:
        ports = [int(x) for x in a.ports.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"swarm-sim: --ports must be integers, got {a.ports!r}") from None
    n = len(ports)
    speeds = _float_list(a.speed, n, "speed")
    errors = _float_list(a.error_rate, n, "error-rate")
    resets = _float_list(a.reset_rate, n, "reset-rate")
    dies = _float_list(a.die_after, n, "die-after")
    stalls = _float_list(a.stall_after, n, "stall-after")
    models = a.model.split(",")
    if len(models) == 1:
        models *= n
    if len(models) != n or not all(m.strip() for m in models):
        raise SystemExit(f"swarm-sim: --model has {len(models)} names for {n} ports")
    endpoints = []
    for i, port in enumerate(ports):
        try:
            config = EngineConfig(
                max_num_seqs=a.max_num_seqs,
                max_model_len=a.max_model_len,
                speed=speeds[i] or 1.0,
                step_base_ms=a.step_ms,
                step_per_seq_ms=a.step_per_seq_ms,
                prefill_ms_per_token=a.prefill_ms_per_token,
                max_num_batched_tokens=a.max_num_batched_tokens,
                prefix_cache_blocks=a.prefix_cache_blocks,
                instant=a.instant,
                ignore_eos=a.ignore_eos,
            )
        except ValueError as exc:  # a setting out of its range
            raise SystemExit(f"swarm-sim: {exc}") from None
        faults = FaultConfig(
            error_rate=errors[i] or 0.0,
            reset_rate=resets[i] or 0.0,
            die_after_s=dies[i],
            stall_after_s=stalls[i],
            fail_on=a.fail_on,
            hang_on=a.hang_on,
        )
        endpoints.append(
            SimEndpoint(
                port,
                config,
                faults,
                host=a.host,
                model=models[i].strip(),
                error_format=a.error_format,
                seed=a.seed,
                bos_token=a.bos_token,
                chat_template_bos=a.chat_template_bos,
                tool_parser=a.tool_call_parser,
                auto_tool_choice=a.enable_auto_tool_choice,
                runner=a.runner,
                prompt_tokens_details=a.enable_prompt_tokens_details,
            )
        )
    return SimFleet(endpoints)


async def _serve(fleet: SimFleet) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with fleet:
        print(f"swarm-sim: serving {', '.join(fleet.urls)}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    fleet = build_fleet(argv)
    with contextlib.suppress(KeyboardInterrupt):
        try:
            asyncio.run(_serve(fleet))
        except OSError as exc:
            print(f"swarm-sim: {exc}", file=sys.stderr)
            raise SystemExit(1) from None
