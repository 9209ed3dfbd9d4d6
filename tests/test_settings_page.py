"""Settings declared once: docs/SETTINGS.md is what the declarations say, and every variable
the product reads is on it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from swarm_queue.common.errors import ConfigError
from swarm_queue.common.settings import Settings, settings_page

ROOT = Path(__file__).resolve().parent.parent


def test_the_settings_page_is_what_the_declarations_say() -> None:
    page = (ROOT / "docs" / "SETTINGS.md").read_text()
    assert page == settings_page(), "run: python -m swarm_queue.common.settings > docs/SETTINGS.md"


def test_every_variable_the_product_reads_is_documented() -> None:
    page = (ROOT / "docs" / "SETTINGS.md").read_text()
    said = set(re.findall(r"`(SWARM_[A-Z_]+)`", page))
    read = {
        var
        for path in (ROOT / "swarm_queue").rglob("*.py")
        for var in re.findall(r"\b(SWARM_[A-Z][A-Z_]*[A-Z])\b", path.read_text())
    }
    assert read - said == set()


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"SWARM_POLL_MS": "0"}, "SWARM_POLL_MS must be >= 1, got 0"),
        ({"SWARM_PROBE_TIMEOUT_S": "0"}, "SWARM_PROBE_TIMEOUT_S must be > 0, got 0.0"),
        ({"SWARM_METRICS_PORT": "70000"}, "SWARM_METRICS_PORT must be <= 65535, got 70000"),
        ({"SWARM_HAND_ON": "maybe"}, "SWARM_HAND_ON='maybe' is not a valid switch (on/off)"),
        ({"SWARM_TOOL_WAIT_S": "soon"}, "SWARM_TOOL_WAIT_S='soon' is not a valid float"),
    ],
)
def test_a_setting_out_of_its_declared_bounds_is_refused_naming_it(
    env: dict[str, str], said: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        Settings.from_env(env)
    assert str(exc.value) == said
