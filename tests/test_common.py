"""Unit tests of swarm_queue/common/: key schema, backoff, hostfile, settings, wire structs."""

from __future__ import annotations

import asyncio
import gc
import socket
import warnings
from pathlib import Path
from typing import Any

import msgspec
import pytest

from swarm_queue.common import cli
from swarm_queue.common.backoff import backoff_s
from swarm_queue.common.embedded import free_port
from swarm_queue.common.errors import ConfigError, JobNameError
from swarm_queue.common.hostfile import normalize_url, parse_endpoints, parse_hostfile
from swarm_queue.common.keys import Keys, validate_job_name
from swarm_queue.common.models import (
    PromptItem,
    Result,
    SamplingParams,
    Usage,
    decode_item,
    decode_result,
    encode,
)
from swarm_queue.common.output import OutputLine
from swarm_queue.common.redisurl import mask_url
from swarm_queue.common.settings import Settings

# -- keys -------------------------------------------------------------------------------


def test_every_job_key_carries_the_job_hash_tag() -> None:
    k = Keys("swarm")
    keys = [k.stream("run-1"), k.results("run-1"), k.meta("run-1")]
    assert keys == ["swarm:{run-1}:q", "swarm:{run-1}:results", "swarm:{run-1}:meta"]
    assert k.jobs == "swarm:jobs"


@pytest.mark.parametrize(
    "bad", ["", "a b", "x}:y", "{other}", "job:1", "-lead", "a" * 129, "naïve", "a\nb", "*"]
)
def test_job_names_that_could_reach_other_keys_are_refused(bad: str) -> None:
    with pytest.raises(JobNameError, match="invalid job name"):
        validate_job_name(bad)
    with pytest.raises(JobNameError):
        Keys().stream(bad)


def test_good_job_names_pass() -> None:
    for good in ["a", "run_2026-11-21", "v1.2", "A" * 128]:
        assert validate_job_name(good) == good


def test_bad_prefix_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="invalid key prefix"):
        Keys("a:{b}")


# -- backoff ----------------------------------------------------------------------------


def test_backoff_grows_then_caps_with_jitter_in_upper_half() -> None:
    lows = [backoff_s(a, base_s=0.5, cap_s=8.0, rand=lambda: 0.0) for a in range(8)]
    highs = [backoff_s(a, base_s=0.5, cap_s=8.0, rand=lambda: 0.999999) for a in range(8)]
    assert lows == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert highs[0] == pytest.approx(0.5, rel=1e-5)
    assert highs[-1] == pytest.approx(8.0, rel=1e-5)
    assert all(lo < hi for lo, hi in zip(lows, highs, strict=True))


def test_backoff_survives_huge_attempt_counts() -> None:
    assert backoff_s(10_000, base_s=1.0, cap_s=30.0, rand=lambda: 0.5) == 22.5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attempt": -1}, "attempt must be >= 0, got -1"),
        ({"attempt": 0, "base_s": 0}, "need 0 < base_s <= cap_s, got base_s=0"),
        ({"attempt": 0, "cap_s": 0.1}, "need 0 < base_s <= cap_s, got base_s=0.5, cap_s=0.1"),
    ],
)
def test_backoff_rejects_nonsense(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        backoff_s(**kwargs)


# -- hostfile ---------------------------------------------------------------------------


def test_hostfile_parses_tabs_default_port_tags_and_comments() -> None:
    text = "# fleet\n\nx1000c0s0b0n0\t8001\tnode=0\trole=leaf\nx1000c0s1b0n0\n\nhost3\tgpu=a100\n"
    eps = parse_hostfile(text, "agents.hostfile")
    assert [e.url for e in eps] == [
        "http://x1000c0s0b0n0:8001",
        "http://x1000c0s1b0n0:8000",
        "http://host3:8000",
    ]
    assert eps[0].tags == {"node": "0", "role": "leaf"}
    assert eps[2].tags == {"gpu": "a100"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("h1\t80x\n", "agents:1: invalid port '80x'"),
        ("# c\nh1\t8000\tnokey\n", "agents:2: expected key=value"),
        ("h1\t99999\n", "agents:1: port 99999 out of range"),
        ("h1 8000\n", "agents:1: invalid host"),
    ],
)
def test_hostfile_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_hostfile(text, "agents")


def test_endpoint_urls_are_normalised() -> None:
    assert normalize_url("host:9000") == "http://host:9000"
    assert normalize_url("http://h:1/v1/") == "http://h:1"
    assert normalize_url("http://[::1]:8000") == "http://[::1]:8000"
    assert normalize_url("x3005c0s13b0n0_hsn0:8000") == "http://x3005c0s13b0n0_hsn0:8000"
    assert [e.url for e in parse_endpoints(" http://a:1 , b:2 ,")] == ["http://a:1", "http://b:2"]
    with pytest.raises(ConfigError):
        normalize_url("ftp://x")


# -- settings ---------------------------------------------------------------------------


def test_settings_from_env_with_overrides() -> None:
    env = {
        "SWARM_REDIS_URL": "redis://:s3cret@db:6380/2",
        "SWARM_ENDPOINTS": "a:1,b:2",
        "SWARM_BATCH_SIZE": "64",
        "SWARM_INFLIGHT": "4",
    }
    s = Settings.from_env(env, inflight=6, redis_url=None)
    assert s.batch_size == 64 and s.inflight == 6
    assert [e.url for e in s.endpoints] == ["http://a:1", "http://b:2"]
    assert s.redis_url == "redis://:s3cret@db:6380/2"
    assert "s3cret" not in repr(s) and "s3cret" not in str(s)


def test_settings_hostfile(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "hosts"
    path.write_text("n1\t8001\nn2\n")
    s = Settings.from_env({"SWARM_HOSTFILE": str(path)})
    assert [e.url for e in s.endpoints] == ["http://n1:8001", "http://n2:8000"]


def test_hostfile_endpoints_filtered_by_tag_and_host(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "hosts"
    path.write_text(
        "# written by the vLLM launch script\n"
        "x1000c0s0b0n0.hsn.example\t8000\tmodel=70b\tgpu=4\n"
        "x1000c0s0b0n0.hsn.example\t8001\tmodel=8b\n"
        "x1000c0s0b0n1\tmodel=70b\n"
    )

    def urls(**env: str) -> list[str]:
        s = Settings.from_env({"SWARM_HOSTFILE": str(path), **env})
        return [e.url for e in s.endpoints]

    assert urls(SWARM_ENDPOINT_TAG="model=70b") == [
        "http://x1000c0s0b0n0.hsn.example:8000",
        "http://x1000c0s0b0n1:8000",
    ]
    assert urls(SWARM_ENDPOINT_HOST="x1000c0s0b0n0") == [
        "http://x1000c0s0b0n0.hsn.example:8000",
        "http://x1000c0s0b0n0.hsn.example:8001",
    ]
    assert urls(SWARM_ENDPOINT_HOST="x1000c0s0b0n0.other", SWARM_ENDPOINT_TAG="model=8b") == [
        "http://x1000c0s0b0n0.hsn.example:8001"
    ]
    with pytest.raises(ConfigError, match=r"hosts: no endpoint with tag model=405b"):
        urls(SWARM_ENDPOINT_TAG="model=405b")
    with pytest.raises(ConfigError, match="expected key=value"):
        urls(SWARM_ENDPOINT_TAG="70b")
    with pytest.raises(ConfigError, match="filter SWARM_HOSTFILE"):
        Settings.from_env({"SWARM_ENDPOINTS": "a:1", "SWARM_ENDPOINT_TAG": "model=8b"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SWARM_BATCH_SIZE": "lots"}, "SWARM_BATCH_SIZE='lots' is not a valid int"),
        ({"SWARM_BATCH_SIZE": "0"}, "SWARM_BATCH_SIZE must be >= 1, got 0"),
        # Before, accepted: every commit of a batch of 5000 failed in Redis's Lua.
        ({"SWARM_BATCH_SIZE": "5000"}, "SWARM_BATCH_SIZE must be <= 2048, got 5000"),
        ({"SWARM_REDIS_URL": "http://x"}, "invalid Redis URL"),
        ({"SWARM_ENDPOINTS": "a:1", "SWARM_HOSTFILE": "/x"}, "not both"),
        ({"SWARM_HOSTFILE": "/nonexistent/hosts"}, "cannot read SWARM_HOSTFILE"),
        ({"SWARM_ENDPOINTS": "http://[::1"}, r"invalid endpoint URL 'http://\[::1': Invalid IPv6"),
        ({"SWARM_ENDPOINTS": "http://n:99999"}, "Port out of range"),
        # Before, accepted and waited on as a host named 'not a url'.
        ({"SWARM_ENDPOINTS": "not a url"}, "'http://not a url': 'not a url' is no host name"),
        ({"SWARM_ENDPOINTS": "http://h;rm/"}, "'h;rm' is no host name or address"),
        (
            {"SWARM_ENDPOINTS": "http://bob:hunter2@n:8000"},
            r"endpoint URL 'http://\*\*\*@n:8000': credentials in the URL are not sent",
        ),
        ({"SWARM_REDIS_URL": "redis://:hunter2@h:99999/0"}, r"invalid Redis URL <invalid url>"),
        ({"SWARM_REDUCE_FUNCTIONS": "os.system"}, "'os.system' is not package.module:function"),
    ],
)
def test_bad_settings_are_clear_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)


def test_mask_url_hides_passwords_only() -> None:
    assert mask_url("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    assert mask_url("rediss://:pw@h/0") == "rediss://:***@h/0"
    assert mask_url("redis://h:1/0") == "redis://h:1/0"
    assert mask_url("redis://h:1/0?password=pw&db=2") == "redis://h:1/0?password=***&db=2"
    assert mask_url("redis://u:pw@[::1]:1/0") == "redis://u:***@[::1]:1/0"
    assert mask_url("redis://u:pw@h:99999/0") == "<invalid url>"  # unparsable: never printed
    assert mask_url("http://[::1") == "<invalid url>"


def test_a_hostfile_that_is_not_utf8_is_one_clear_error(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_bytes(b"node1\t8000\tmodel=caf\xe9\n")
    with pytest.raises(ConfigError, match=f"SWARM_HOSTFILE {hosts}: not UTF-8 text"):
        Settings.from_env({"SWARM_HOSTFILE": str(hosts)})


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0, got nan"),
        ({"temperature": float("inf")}, "temperature must be a finite number >= 0, got inf"),
        ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"max_tokens": 10**30}, "max_tokens must be 1..2147483647"),
        ({"seed": 2**64}, "seed must fit in 64 bits"),
    ],
)
def test_sampling_values_no_server_takes_are_refused(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SamplingParams(**params)


# -- wire structs -----------------------------------------------------------------------


def test_prompt_item_and_result_round_trip() -> None:
    item = PromptItem(7, "hello", "req-7")
    assert decode_item(encode(item)) == item
    r = Result(
        index=7,
        text="hi",
        finish_reason="stop",
        usage=Usage(3, 2),
        endpoint="e",
        attempts=1,
        custom_id="req-7",
    )
    assert decode_result(encode(r)) == r and r.ok
    assert not Result(index=1, error="boom").ok


def test_output_line_has_custom_id_only_when_given() -> None:
    plain = msgspec.json.decode(msgspec.json.encode(OutputLine.of(Result(index=0, text="t"))))
    assert list(plain) == [
        "index",
        "text",
        "finish_reason",
        "usage",
        "endpoint",
        "attempts",
        "error",
        "model",
    ]
    tagged = msgspec.json.decode(
        msgspec.json.encode(OutputLine.of(Result(index=0, text="t", custom_id="c")))
    )
    assert tagged["custom_id"] == "c"


def test_swarm_retry_kinds_are_the_failure_kinds_that_keep_their_entry(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from swarm_queue.common.vocab import RETRYABLE_KINDS, FailureKind
    from swarm_queue.producer.ops import retry_main

    assert [str(k) for k in RETRYABLE_KINDS] == [
        "rejected",
        "no_choice",
        "server_error",
        "malformed",
        "schema",
        "no_content",
        "dead_letter",
        "cancelled",
        "bad_entry",
        "measure",
    ]
    assert FailureKind.MISSING not in RETRYABLE_KINDS  # evicted: nothing left to queue again
    with pytest.raises(SystemExit) as usage:
        retry_main(["job", "--kind", "endpoint"])
    assert usage.value.code == 2
    assert "argument --kind: invalid choice: 'endpoint'" in capsys.readouterr().err


def test_a_line_printed_in_python_shows_no_unset_field() -> None:
    """Seen: ``custom_id=UNSET`` in every pipeline and best-of line a script printed."""
    from swarm_queue.common.output import OutputLine
    from swarm_queue.flows.bestof.flow import BestLine
    from swarm_queue.flows.pipeline.output import ChainLine

    for line in (ChainLine(0, text="a"), BestLine(0, text="a"), OutputLine(0, text="a")):
        assert "UNSET" not in repr(line) and "text='a'" in repr(line)


def test_an_interrupt_before_a_command_starts_says_interrupted_and_nothing_more(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seen: Ctrl-C on a collector printed "coroutine ... was never awaited": the interrupt
    came before the event loop ran the command's coroutine. It says it was interrupted, once."""

    async def command_main() -> int:
        return 0

    def interrupted(coro: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(asyncio, "run", interrupted)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.run("swarm-collect", command_main()) == 130
        gc.collect()
    assert [str(w.message) for w in caught] == []
    assert capsys.readouterr().err == "swarm-collect: interrupted\n"


def test_a_free_port_for_a_server_is_below_the_range_outgoing_connections_take() -> None:
    """A port the kernel may give any outgoing connection can be taken between its choice
    and the server's bind (seen: a worker's metrics port, a cluster node's bus port): a
    server's port is picked below that range, and with ``pair`` its partner is free too."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert 10_000 <= port < low
        node = free_port(pair=10_000)
        assert node + 10_000 < low
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", node))
            b.bind(("127.0.0.1", node + 10_000))
