"""The report's tables of resumes and checkpoints, and the reference run's comparison.

Each returns markup built by :mod:`recovery.tools.report.html` (every text escaped).
:func:`resumes_table` is the drill's page's too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from recovery.run.scheduling import slurm
from recovery.tools.report.cost import duration
from recovery.tools.report.html import Cell, badge, para, table
from recovery.tools.report.run import Checkpoint, Story, items, num

_HEALTH_CSS = {"ok": "ok", "warn": "warn"}
"""Badge style of a health verdict (skipped, not judged: muted)."""


def resumes_table(st: Story) -> str:
    """One row per resume: the checkpoint it came from, its health verdict (each signal's
    z against the band), what was restored and declared absent, drift, world size, and
    the work it redid."""
    rows = []
    for r in st.resumes:
        health = r.health or {}
        found = health.get("signals")
        signals: dict[str, Any] = found if isinstance(found, dict) else {}
        zs = ", ".join(
            f"{name} z={num(s.get('z')) or 0.0:.2f}"
            for name, s in sorted(signals.items())
            if isinstance(s, dict)
        )
        verdict = r.verdict + (
            f" (departed: {', '.join(map(str, items(health.get('departed'))))})"
            if items(health.get("departed"))
            else ""
        )
        absent = "; ".join(f"{k}: {v}" for k, v in sorted(r.absent.items()))
        world = str(r.world_size or "-") + (
            f" (resharded {r.resharded.get('from')}->{r.resharded.get('to')})"
            if r.resharded
            else ""
        )
        redone = f"{r.redone[0]}-{r.redone[1]}" if r.redone else "none"
        rows.append(
            [
                r.step,
                Cell(r.name),
                Cell(r.source, "muted"),
                badge(verdict, _HEALTH_CSS.get(r.verdict, "muted")),
                zs or health.get("reason") or "-",
                ", ".join(r.restored) or "-",
                absent or "-",
                ", ".join(r.drift) or "none",
                world,
                redone,
                badge(r.checked, "warn" if r.checked.startswith("INEXACT") else "ok")
                if r.check
                else Cell("not compared", "muted"),
                r.previous_end + (f"; {slurm.describe(r.job)}" if r.job else ""),
            ]
        )
    head = [
        "step",
        "resumed from",
        "path (journal)",
        "health",
        "signals",
        "restored",
        "declared absent",
        "drift",
        "world",
        "steps redone",
        "self-check",
        "process before",
    ]
    return table(head, rows) if rows else para("The run was never resumed.", "muted")


def reference_summary(st: Story, name: str, ref: dict[int, dict[str, Any]]) -> str:
    """Whether this run's loss and learning rate equal the reference's, step by step."""
    common = sorted(s for s in st.steps if s in ref)
    diffs = [
        (s, key)
        for s in common
        for key in ("loss", "lr")
        if key in st.steps[s] and st.steps[s].get(key) != ref[s].get(key)
    ]
    if not common:
        return para(f"reference {name}: no step in common with this run", "warn")
    if not diffs:
        return para(
            f"reference {name}: loss and learning rate bitwise identical at all "
            f"{len(common)} common steps",
            "ok",
        )
    pairs = [(num(st.steps[s].get("loss")), num(ref[s].get("loss"))) for s, k in diffs]
    losses = [abs(a - b) for a, b in pairs if a is not None and b is not None]
    worst = f"; largest |loss difference| {max(losses):.3g}" if losses else ""
    return para(
        f"reference {name}: {len({s for s, _ in diffs})} of {len(common)} common steps "
        f"differ, the first at step {diffs[0][0]} ({diffs[0][1]}){worst}",
        "warn",
    )


def signer_text(signer: dict[str, Any] | None) -> str:
    """``63f7f2ef1a2b (dev key, trusted)``, as ``recovery ls`` writes it."""
    if not signer:
        return "-"
    tags = [
        t for t, on in (("dev key", signer.get("dev")), ("trusted", signer.get("trusted"))) if on
    ] or ["UNTRUSTED"]
    return f"{str(signer.get('key_id'))[:12]} ({', '.join(tags)})"


def checkpoints_table(rows: Sequence[Checkpoint]) -> str:
    """One row per checkpoint: where it is, verified or not, DVC, signer, its save's cost."""
    body = []
    for r in rows:
        save = r.save
        verdict = Cell(
            r.verdict or "not on disk", "bad" if r.failed else "ok" if r.verdict else "muted"
        )
        body.append(
            [
                r.step,
                Cell(r.name),
                r.where + (f" ({r.branch})" if r.branch else ""),
                "yes" if r.best else "",
                verdict,
                r.dvc or "-",
                signer_text(r.signer),
                r.world_size or "-",
                save.mode if save else "-",
                duration(save.pause_s) if save else "-",
                duration(save.write_s) if save else "-",
                f"{save.bytes:,}" if save and save.bytes is not None else "-",
                f"{r.loss:.6g}" if r.loss is not None else "-",
            ]
        )
    head = [
        "step",
        "name",
        "where",
        "best",
        "verified",
        "dvc",
        "signer",
        "ranks",
        "mode",
        "pause",
        "write",
        "bytes",
        "loss",
    ]
    return table(head, body) if body else para("No checkpoint was committed.", "muted")
