"""Commands packed by hiredis are the bytes redis-py packs (every client of a lone Redis the
store makes sends them so); what hiredis does not take is refused as redis-py refuses it."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from swarm_queue.common.store.connection import connect
from swarm_queue.common.store.packing import packed_by_hiredis

COMMANDS: list[tuple[object, ...]] = [
    ("HSET", "{j}:results", "17", b"\x00\xc1 a blob \xff", "18", b""),
    ("CONFIG GET", "maxmemory"),
    (b"CLIENT SETNAME", "w"),
    ("EVALSHA", "ab" * 20, 2, "{j}:meta", "{j}:stream", 0, -1, 2**70, 0.1, 1e20, "é 𝄞"),
    ("XADD", "{j}:stream", "0-17", "d", b"x" * 100_000),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: str(c[0]))
async def test_a_command_packed_by_hiredis_is_the_bytes_redis_py_packs(
    command: tuple[object, ...],
) -> None:
    client = packed_by_hiredis(connect("redis://127.0.0.1:9", patient=False))
    try:
        packed = client.connection_pool.make_connection()
        assert type(packed) is not Connection
        plain = Connection()
        assert b"".join(packed.pack_command(*command)) == b"".join(plain.pack_command(*command))
    finally:
        await client.aclose()


@pytest.mark.parametrize("bad", [True, None, 1j])
async def test_what_hiredis_does_not_take_is_refused_as_redis_py_refuses_it(bad: object) -> None:
    client = connect("redis://127.0.0.1:9", patient=False)
    try:
        packed = client.connection_pool.make_connection()
        with pytest.raises(DataError) as ours:
            packed.pack_command("SET", "k", bad)
        with pytest.raises(DataError) as theirs:
            Connection().pack_command("SET", "k", bad)
        assert str(ours.value) == str(theirs.value)
    finally:
        await client.aclose()
