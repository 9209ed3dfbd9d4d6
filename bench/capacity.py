"""How large a fleet one Redis core feeds, from Redis's measured CPU time per prompt (scenario
4): a core spends ``us`` microseconds per prompt, so it carries ``1e6 / us`` prompts/s, shared
by endpoints each answering ``rate`` prompts/s. Drawn for docs/SCALE.md."""

from __future__ import annotations

from pathlib import Path

__all__ = ["endpoints_fed", "plot_capacity"]

# Prompts per second per endpoint, from a small model with short outputs down to long outputs.
RATES = (1, 2, 5, 10, 20, 50, 100, 200, 500)


def endpoints_fed(us_per_prompt: float, rate: float) -> float:
    """Endpoints answering ``rate`` prompts/s each that one Redis core keeps fed."""
    return 1e6 / us_per_prompt / rate


def plot_capacity(us_per_prompt: dict[str, float], path: Path) -> None:
    """Endpoints fed by one Redis core against each endpoint's prompt rate, one line per
    measured configuration (label -> Redis CPU us per prompt)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for label, us in us_per_prompt.items():
        fed = [endpoints_fed(us, r) for r in RATES]
        ax.plot(RATES, fed, marker="o", label=f"{label}: {us:.1f} us of Redis CPU per prompt")
    ax.axhline(1000, color="grey", linestyle=":", linewidth=1, label="1,000 endpoints")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("prompts/s per endpoint (vLLM server)")
    ax.set_ylabel("endpoints one Redis core feeds")
    ax.set_title("One Redis core, at Redis CPU per prompt measured in scenario 4")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
