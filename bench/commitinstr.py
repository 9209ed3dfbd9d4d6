"""Redis's instructions a commit at the default batch, alone: one job of chunk 16, two
batches of 32 in one consumer's hands, then ``COMMITS`` commits each of the older batch's
32 answers carrying the slot's next read (``commit(read=)``), as a lone job's slot makes
them; Redis run under callgrind as in :mod:`bench.redisinstr` (its redis-server: the first
on ``PATH``). Seconds to run where a whole job takes a minute, and nothing else (no
collector's polls, no producer) in the count: what a change to ``lua/commit.lua`` is worth.

    python -m bench.commitinstr [COMMITS] [--keep FILE]

``--keep FILE`` keeps the dump (``callgrind_annotate --inclusive=yes FILE`` tells where).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path

from bench.redisinstr import _callgrind, _dumped_ir, _last_dump, _wrapper
from swarm_queue.common.embedded import EmbeddedRedis
from swarm_queue.common.feed import enqueue_prompts
from swarm_queue.common.models import JobSpec, Result, SamplingParams, Usage
from swarm_queue.common.settings import Settings
from swarm_queue.common.store import JobStore
from swarm_queue.common.store.entries import index_of

CHUNK, ENTRIES = 16, 2  # (a batch of 32: two entries)


async def main(commits: int, keep: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="swarm-commitinstr-") as tmp:
        out = Path(tmp) / "callgrind.out"
        server = EmbeddedRedis(binary=_wrapper(Path(tmp), out)).start(timeout_s=120)
        assert server.proc is not None
        store = JobStore.from_settings(Settings(redis_url=server.url))
        try:
            spec = JobSpec(job="j", params=SamplingParams(max_tokens=16), chunk=CHUNK)
            n = (commits + 3) * CHUNK * ENTRIES
            prompts = ((f"question {i}: what is {i} squared? " * 5, None) for i in range(n))
            await enqueue_prompts(store, spec, prompts)
            gen = (await store.load_spec("j")).generation
            held = [(await store.take_new("j", "c1", ENTRIES, gen=gen))[0] for _ in range(2)]

            async def commit_one() -> None:
                answers = [
                    (eid, Result(index=i, text=f"answer {i} " * 8, usage=Usage(40, 30)), None)
                    for eid, _, _ in held.pop(0)
                    for i in range(index_of(eid), index_of(eid) + CHUNK)
                ]
                c = await store.commit("j", answers, gen=gen, chunk=CHUNK, read=("c1", ENTRIES))
                held.append(c.taken)

            await commit_one()  # (the script loaded: its compiling is not counted)
            _callgrind(server.proc.pid, "--zero")
            for _ in range(commits):
                await commit_one()
            _callgrind(server.proc.pid, "--dump")
            ir = _dumped_ir(out, server.proc.pid)
            if keep is not None:
                shutil.copyfile(_last_dump(out, server.proc.pid), keep)
            size = CHUNK * ENTRIES
            print(f"{ir / commits:,.0f} instructions a commit of {size} carrying its read")
        finally:
            await store.close()
            server.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("commits", type=int, nargs="?", default=200)
    p.add_argument("--keep", type=Path, help="a file to keep the callgrind dump in")
    a = p.parse_args()
    asyncio.run(main(a.commits, a.keep))
