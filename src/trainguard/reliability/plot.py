"""PNG plots of the reliability analytics (matplotlib, ``pip install 'trainguard[plot]'``):
survival curves of a fit, the simulator's distributions, the fleet's MTBF and trend."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from trainguard.reliability import need, survival
from trainguard.reliability.titan import TitanGpu


def _plt() -> Any:
    matplotlib = need("matplotlib", extra="plot")
    matplotlib.use("Agg")
    return need("matplotlib.pyplot", extra="plot")


@contextlib.contextmanager
def _figure(path: str | Path, panels: int, figsize: tuple[float, float], **kw: Any) -> Iterator[Any]:
    """A row of ``panels`` axes (one axes when 1), gridded, laid out and saved to ``path`` once
    the block has drawn them; the figure is closed either way."""
    plt = _plt()
    fig, axes = plt.subplots(1, panels, figsize=figsize, **kw)
    try:
        yield axes
        for a in axes if panels > 1 else [axes]:
            a.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def plot_titan(gpus: Sequence[TitanGpu], path: str | Path) -> None:
    """Three panels: KM survival of the old and new batches (95% bands), the old batch by cage,
    and the old batch's cumulative incidence of DBE and OTB removals."""
    lifelines = need("lifelines")
    with _figure(path, 3, (15, 4.6)) as axes:
        ax = axes[0]
        for batch, color in (("old", "#c62828"), ("new", "#1565c0")):
            sel = [g for g in gpus if g.batch == batch]
            km = survival.kaplan_meier(
                [g.years for g in sel], [g.dead for g in sel], f"{batch} batch (n={len(sel)})"
            )
            km.plot_survival_function(ax=ax, color=color, ci_show=True)
        ax.set(
            title="Titan K20X GPUs: Kaplan-Meier survival",
            xlabel="years in service",
            ylabel="S(t)",
            ylim=(0, 1.02),
        )
        old = [g for g in gpus if g.batch == "old"]
        ax = axes[1]
        for cage, color in zip((0, 1, 2), ("#2e7d32", "#f9a825", "#c62828"), strict=True):
            sel = [g for g in old if g.cage == cage]
            label = f"cage {cage}" + (" (bottom)" if cage == 0 else " (top)" if cage == 2 else "")
            km = survival.kaplan_meier([g.years for g in sel], [g.dead for g in sel], label)
            km.plot_survival_function(ax=ax, color=color, ci_show=True)
        ax.set(
            title="old batch by cage (airflow runs bottom to top)", xlabel="years in service", ylim=(0, 1.02)
        )
        ax = axes[2]
        codes = [{"": 0, "dbe": 1, "otb": 2}[g.cause] for g in old]
        for code, name, color in (
            (1, "double-bit ECC (DBE)", "#6a1b9a"),
            (2, "off the bus (OTB)", "#ef6c00"),
        ):
            aj = lifelines.AalenJohansenFitter(calculate_variance=False, seed=0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                aj.fit([g.years for g in old], codes, event_of_interest=code)
            cif = aj.cumulative_density_
            ax.step(cif.index, cif.iloc[:, 0], where="post", color=color, label=name)
        ax.set(
            title="old batch: cumulative incidence by cause",
            xlabel="years in service",
            ylabel="P(removed by t)",
        )
        ax.legend(loc="upper left")


def plot_store_fit(durations: Sequence[float], events: Sequence[bool], path: str | Path) -> None:
    with _figure(path, 1, (7, 4.5)) as ax:
        survival.kaplan_meier(durations, events, "time to interruption").plot_survival_function(ax=ax)
        ax.set(
            title="jobs in the incident store: Kaplan-Meier", xlabel="hours", ylabel="S(t)", ylim=(0, 1.02)
        )


def plot_simulation(results: dict[str, Any], path: str | Path) -> None:
    """Per scenario (name -> SimResult): the distribution of interruptions and of ETTR over
    trials, and the mean count per category."""
    np = need("numpy")
    with _figure(path, 3, (16, 4.8), gridspec_kw={"width_ratios": [1, 1, 1.3]}) as axes:
        first = next(iter(results.values()))
        cfg = first.config
        # The scenarios share their seed, so they see the same failures: one count histogram.
        axes[0].hist(first.interruptions, bins=30, color="#1565c0", alpha=0.8)
        lo = min(float(r.ettr.min()) for r in results.values())
        hi = max(float(r.ettr.max()) for r in results.values())
        bins = np.linspace(lo, hi, 40) if hi > lo else 10
        for name, r in results.items():
            axes[1].hist(
                r.ettr, bins=bins, histtype="step", lw=1.8, label=f"{name}: mean {r.ettr.mean():.4f}"
            )
        axes[0].set(
            title=f"interruptions in {cfg.days:g} days, {cfg.gpus:,} GPUs ({cfg.trials} trials)",
            xlabel="interruptions",
            ylabel="trials",
        )
        axes[1].set(title="ETTR per trial", xlabel="ETTR", ylabel="trials")
        means = first.by_category.mean(axis=0)
        order = np.argsort(means)
        names = [cfg.categories[i].name.replace("_", " ") for i in order]
        axes[2].barh(names, means[order], color="#1565c0")
        axes[2].set(title="mean interruptions by root cause", xlabel="interruptions per run")
        axes[2].tick_params(axis="y", labelsize=8)
        axes[1].legend(fontsize=8)


def plot_fleet(report: dict[str, Any], path: str | Path, top: int = 12) -> None:
    """Incidents per period stacked by root cause (the trend), the worst GPUs and nodes (lemons
    in red), and MTBF per root cause."""
    with _figure(path, 3, (16, 4.8)) as axes:
        bins = report["trend"]["bins"]
        ax = axes[0]
        if bins:
            t0 = bins[0]["start"]
            x = [(b["start"] - t0) / 3600.0 for b in bins]
            w = (bins[0]["end"] - bins[0]["start"]) / 3600.0
            causes = [c["root_cause"] for c in report["by_root_cause"]]
            bottom = [0] * len(bins)
            for cause in causes:
                h = [b["by_cause"].get(cause, 0) for b in bins]
                ax.bar(x, h, width=w, bottom=bottom, align="edge", label=cause.replace("_", " "))
                bottom = [a + b for a, b in zip(bottom, h, strict=True)]
            ax.legend(fontsize=7)
        ax.set(
            title=f"incidents over time (trend: {report['trend']['verdict']})",
            xlabel="hours since the first job",
            ylabel="incidents",
        )
        ax = axes[1]
        units = [(u["unit"], u) for u in report["gpus"][: top // 2]] + [
            (u["unit"], u) for u in report["nodes"][: top // 2]
        ]
        units.reverse()
        ax.barh(
            [name for name, _ in units],
            [u["incidents"] for _, u in units],
            color=["#c62828" if u["lemon"] else "#90a4ae" for _, u in units],
        )
        ax.set(title="worst GPUs and nodes (red: lemon)", xlabel="incidents")
        ax.tick_params(axis="y", labelsize=8)
        ax = axes[2]
        rows = [c for c in report["by_root_cause"] if c["mtbf_hours"] is not None][::-1]
        ax.barh(
            [c["root_cause"].replace("_", " ") for c in rows],
            [c["mtbf_hours"] for c in rows],
            color="#1565c0",
        )
        ax.set(title="MTBF by root cause", xlabel="hours")
        ax.tick_params(axis="y", labelsize=8)
