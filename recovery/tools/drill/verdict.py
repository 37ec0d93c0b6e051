"""The verdict of a drill: two runs compared at a declared level, the report and its plot.

Both drills (:mod:`recovery.tools.drill`, :mod:`recovery.tools.drill.command`) compare
the per-step records (the journal's last record of each step, ``metrics.jsonl`` in each
run directory) and the final checkpoints' tensors, read through the verifying reader.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from recovery.format.layout import METRICS_FILE
from recovery.integrity.keys.signing import TrustStore
from recovery.run.journal import effective_steps, read
from recovery.run.monitoring import fingerprint
from recovery.run.restoring import choose

log = logging.getLogger(__name__)

DRILL_FILE = "drill.json"
PLOT_FILE = "drill.png"


@dataclass(frozen=True)
class Level:
    """How equal two runs must be: ``bitwise``, or ``tolerance`` within atol + rtol * |ref|."""

    level: str = "bitwise"
    atol: float = 0.0
    rtol: float = 0.0

    def close(self, x: float, y: float) -> bool:
        """Two numbers: the reference's ``x``, the drilled run's ``y``."""
        if self.level == "bitwise":
            return x == y
        return abs(x - y) <= self.atol + self.rtol * abs(x)

    def same(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        """Two tensors at this level (a shape or dtype change is never the same bitwise)."""
        if self.level == "bitwise":
            return torch.equal(a, b)
        return torch.allclose(a.double(), b.double(), atol=self.atol, rtol=self.rtol)


def flat_tensors(tree: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a state tree, keyed by its path."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(tree, torch.Tensor):
        out[prefix] = tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            out |= flat_tensors(v, f"{prefix}/{k}")
    elif isinstance(tree, list | tuple):
        for i, v in enumerate(tree):
            out |= flat_tensors(v, f"{prefix}/{i}")
    return out


def _real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def compare_steps(
    ref: Path, victim: Path, level: Level, *, keys: Sequence[str] | None = None
) -> list[str]:
    """Every difference between two runs' per-step records (the journal's last record of
    each step, ``metrics.jsonl`` in each run directory), one line each.

    ``keys``: the fields compared (default: every field either record has; the modules'
    fingerprint only where both runs took it). A float is compared at ``level``;
    anything else (ids, epochs, lists) must be equal.
    """
    a, b = effective_steps(ref / METRICS_FILE), effective_steps(victim / METRICS_FILE)
    diffs: list[str] = []
    for step in sorted(a):
        if step not in b:
            diffs.append(f"step {step}: missing from the drilled run")
            continue
        names = keys if keys is not None else sorted((a[step].keys() | b[step].keys()) - {"step"})
        for key in names:
            if key not in a[step] or key not in b[step]:
                if key not in fingerprint.FIELDS:  # taken every K steps, K from timing
                    diffs.append(f"step {step}: {key} present in one run only")
                continue
            x, y = a[step][key], b[step][key]
            if _real(x) and _real(y) and (isinstance(x, float) or isinstance(y, float)):
                if not level.close(float(x), float(y)):
                    diffs.append(f"step {step}: {key} {x!r} (reference) vs {y!r} (drilled)")
            elif x != y:
                diffs.append(f"step {step}: {key} differs")
    return diffs


def compare_final(
    ref: Path,
    victim: Path,
    trust: TrustStore,
    level: Level,
    *,
    allow_untrusted: bool = False,
    components: Sequence[str] = ("model", "optimizer"),
) -> list[str]:
    """Every difference between two final checkpoints' ``components`` tensors, each
    checkpoint read through the verifying reader (a damaged or untrusted one raises).

    Raises:
        VerificationError: either checkpoint does not verify.
        CheckpointNotFoundError: either is not there.
    """
    ta = choose.load(ref, trust, allow_untrusted=allow_untrusted).decoded.tree
    tb = choose.load(victim, trust, allow_untrusted=allow_untrusted).decoded.tree
    diffs: list[str] = []
    for component in components:
        fa, fb = flat_tensors(ta.get(component)), flat_tensors(tb.get(component))
        for key in sorted(fa.keys() | fb.keys()):
            if key not in fa or key not in fb:
                diffs.append(f"final {component}{key}: present in one run only")
                continue
            x, y = fa[key], fb[key]
            if not level.same(x, y):
                worst = (
                    float((x.double() - y.double()).abs().max())
                    if x.shape == y.shape
                    else float("nan")
                )
                diffs.append(f"final {component}{key}: differs (max |diff| {worst:.3g})")
    return diffs


@dataclass
class Report:
    """A drill's outcome."""

    passed: bool
    level: str
    kills: list[dict[str, Any]]
    resumes: list[int]
    differences: list[str]
    steps: int
    seconds: float
    plot: str | None = None
    reference: str | None = None
    """The uninterrupted run's directory."""
    victim: str | None = None
    """The drilled (killed and resumed) run's directory."""


def conclude(
    out: Path,
    ref: Path,
    victim: Path,
    *,
    level: str,
    kills: list[dict[str, Any]],
    differences: list[str],
    steps: int,
    started: float,
    draw: Callable[[Path, Path, Path, Report], Path] | None = None,
) -> Report:
    """The report of a finished drill, with its plot (``draw``, default :func:`plot`;
    none when matplotlib is missing), written to ``out/drill.json``. ``ref``,
    ``victim``: the two run directories; ``started``: the drill's ``time.time()``."""
    records = read(victim / METRICS_FILE)
    report = Report(
        passed=not differences,
        level=level,
        kills=kills,
        resumes=[int(r["step"]) for r in records if r.get("event") == "resume"],
        differences=differences,
        steps=steps,
        seconds=time.time() - started,
        reference=str(ref),
        victim=str(victim),
    )
    try:
        report.plot = str((draw or plot)(out, ref, victim, report))
    except ImportError as err:  # the verdict stands without its picture
        log.warning("drill: no plot (%s); pip install -e '.[plot]' for drill.png", err)
    (out / DRILL_FILE).write_text(json.dumps(asdict(report), indent=1))
    return report


def plot(out: Path, ref: Path, victim: Path, report: Report) -> Path:
    """``out/drill.png``: both loss curves, each kill numbered and labelled with its phase
    (each kill a row of its own below the curves, so none hides another), and the resumes
    (:func:`recovery.tools.drill.chart.drill_figure`, also the picture of ``drill.html``).

    Raises:
        ImportError: matplotlib is not installed (the ``[plot]`` extra).
    """
    import matplotlib  # noqa: F401  (ImportError here: the verdict stands without a picture)

    from recovery.tools.drill.chart import drill_figure, drill_style

    with drill_style() as plt:
        fig = drill_figure(
            plt,
            effective_steps(ref / METRICS_FILE),
            effective_steps(victim / METRICS_FILE),
            report.kills,
            report.resumes,
            title(report),
        )
        path = out / PLOT_FILE
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return path


def title(report: Report) -> str:
    """The picture's title: kills, level, verdict."""
    verdict = "PASS" if report.passed else f"FAIL ({len(report.differences)} differences)"
    return f"kill-and-resume drill: {len(report.kills)} kills, level {report.level}: {verdict}"
