"""Progress for long work: byte bars for large saves and loads, event lines with the
time left for long commands (the drill), and the estimate behind them.

A bar appears only when stderr is a terminal; otherwise a byte bar does nothing (the
caller's log lines are the record) and event lines are plain lines on stderr, which
tests and CI capture. Nothing here writes to stdout: a command's ``--json`` there
stays machine-readable. tqdm is thread-safe, so a background save may drive a bar.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from tqdm import tqdm

MIN_BYTES = 256 << 20


@contextmanager
def bytes_bar(total: int, desc: str) -> Iterator[Callable[[int], None]]:
    """Yield ``update(n_bytes)``; shows a bar only on a terminal and for ``total >= MIN_BYTES``."""
    if total < MIN_BYTES or not sys.stderr.isatty():
        yield lambda n: None
        return
    with tqdm(total=total, desc=desc, unit="B", unit_scale=True, leave=False) as bar:
        yield bar.update


def estimate_left(samples: Sequence[tuple[float, float]], todo: Sequence[float]) -> float | None:
    """Seconds the jobs ``todo`` will take, each given by its size (the steps a run trains),
    from ``samples``: ``(size, seconds)`` measured so far. ``None`` before any sample.

    A job is taken to cost a fixed start-up plus a cost per unit of size, the line fitted
    to the samples by least squares. Where the samples cannot fix a line (one size only)
    or fit one that cannot be (a negative start-up or slope: noise), the fallback is a
    cost proportional to size, or, with every sample of size 0, a fixed cost per job.
    """
    if not samples:
        return None
    n = len(samples)
    mean_w = sum(w for w, _ in samples) / n
    mean_s = sum(s for _, s in samples) / n
    var = sum((w - mean_w) ** 2 for w, _ in samples)
    slope = -1.0
    if var > 0:
        slope = sum((w - mean_w) * (s - mean_s) for w, s in samples) / var
    fixed = mean_s - slope * mean_w
    if slope < 0 or fixed < 0:
        fixed, slope = (0.0, mean_s / mean_w) if mean_w > 0 else (mean_s, 0.0)
    return sum(fixed + slope * w for w in todo)


def duration_text(seconds: float) -> str:
    """``14 s``, ``1 min 10 s``, ``2 h 05 min``: a duration as a person reads it."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Lines:
    """Event lines on stderr: above a tqdm bar of ``total`` events on a terminal, plain
    lines otherwise. ``say(text)`` prints a line; ``advance`` also moves the bar."""

    def __init__(self, bar: tqdm[None] | None) -> None:
        self._bar = bar

    def say(self, text: str, *, advance: int = 0, left: str = "") -> None:
        """Print ``text``; move the bar ``advance`` events on, its estimate now ``left``."""
        if self._bar is None:
            print(text, file=sys.stderr, flush=True)
            return
        self._bar.write(text, file=sys.stderr)
        self._bar.set_postfix_str(f"est. {left} left" if left else "", refresh=False)
        self._bar.update(advance)


@contextmanager
def event_lines(total: int, desc: str) -> Iterator[Lines]:
    """Yield :class:`Lines` for ``total`` events: a bar only when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield Lines(None)
        return
    fmt = "{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed}{postfix}"
    # events are seconds apart: each redraws the bar (tqdm's default waits 0.1 s)
    with tqdm(
        total=total, desc=desc, bar_format=fmt, leave=False, file=sys.stderr, mininterval=0
    ) as bar:
        yield Lines(bar)
