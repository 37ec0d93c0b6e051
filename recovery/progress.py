"""Progress bars for long saves and loads, on a terminal only.

A bar appears when stderr is a terminal and the work is large enough to be
worth watching; otherwise the callback does nothing and the log lines of the
caller are the record. tqdm is thread-safe, so a background save may drive it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
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
