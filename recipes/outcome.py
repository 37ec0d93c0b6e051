"""How a training run went, in a few words: what ``train.py`` returns to Hydra, so a
sweep can say per job whether it was new, resumed, or already finished."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Outcome:
    """A run's exit code, and how it began and ended (:func:`said`)."""

    code: int
    said: str = ""


def said(run_dir: Path, *, started: int, ended: int, final: int, resumed: bool, warm: bool) -> str:
    """``run DIR: new, trained to step 60``; ``resumed from step 30, trained to step 60``;
    ``finished at step 60 before: nothing to train``; ``warm-started, trained to ...``."""
    if resumed and started >= final:
        return f"run {run_dir}: finished at step {started} before: nothing to train"
    if resumed:
        return f"run {run_dir}: resumed from step {started}, trained to step {ended}"
    how = "new, warm-started" if warm else "new"
    return f"run {run_dir}: {how}, trained to step {ended}"
