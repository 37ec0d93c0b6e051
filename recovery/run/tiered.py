"""The ending half of a checkpointer with a local tier (:mod:`recovery.run.tiers`): what
:class:`~recovery.run.ending.Ending` does, after the local tier's writes in flight."""

from __future__ import annotations

from recovery.run.ending import Ending
from recovery.run.localtier import LocalTier


class Tiered(Ending):
    """Flush and close, the local tier's snapshot write and promotion in flight first (the
    checkpointer's base, which sets :attr:`local`)."""

    local: LocalTier | None

    def flush(self) -> None:
        """Wait until the save or promotion in flight (if any) is committed, and the
        checkpoints retention retired are deleted.

        Raises:
            CommitError: it failed.
        """
        try:
            if self.local is not None:
                self.pause_s += self.local.wait()
        finally:
            super().flush()

    def close(self) -> None:
        """As :meth:`Ending.close`; with a local tier, first the promotion in flight is
        finished and the local directory removed when the newest snapshot's step is one the
        persistent tier committed (:attr:`~recovery.run.ending.Ending.persisted`; a step
        whose promotion failed is not, whoever was told of the failure).

        Raises:
            CommitError: the last background save or promotion failed.
        """
        if self._closed or self.local is None:
            super().close()
            return
        try:
            try:  # first: the step the promotion in flight commits is persisted then
                self.pause_s += self.local.wait()
                # under torchrun the last persistent save may still be on its thread
                self.pause_s += self._saver.wait()
            finally:  # under torchrun, ranks other than 0 know the step from the saver
                steps = [s for s in (self.persisted, self._saver.persisted) if s is not None]
                self.pause_s += self.local.close(max(steps, default=None))
        finally:
            super().close()
