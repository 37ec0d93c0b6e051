"""``recovery report``: a run's story as one self-contained HTML page.

:func:`build` reads a run directory and nothing else it does not verify: the journal
(``metrics.jsonl``, shown as what the run recorded: :mod:`recovery.tools.report.run`),
the committed checkpoints, each verified in full by the audit's walk
(:func:`recovery.tools.audit.audit`: signature and trust, every file's hash, the purpose
contract; nothing is unpickled, only verified bytes are decoded) from the run's newest
checkpoint, each abandoned branch's newest, its best and warm-start copies, any export
named, and any checkpoint on disk no walk reached; the DVC state where DVC tracks the run
(:mod:`recovery.storage.tracking`, as ``recovery ls`` shows it); and, with ``reference``,
another run's journal to overlay. The page itself is :mod:`recovery.tools.report.page`.

A checkpoint that fails verification is shown failed (red, with the error), and listed in
:attr:`Built.failures` so the caller can fail as ``recovery audit`` does; the report is
still written, since that is when people need to look.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported on first use: ``recovery ls`` needs only the journal's story
    from recovery.tools.report.assemble import MISSING, Built, build, require_run, write

__all__ = ["MISSING", "Built", "build", "require_run", "write"]


def __getattr__(name: str) -> Any:
    """The page builder's names, imported on first use (it verifies checkpoints: torch)."""
    if name in __all__:
        from recovery.tools.report import assemble

        return getattr(assemble, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
