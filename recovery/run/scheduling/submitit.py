"""submitit jobs that checkpoint at a step boundary, and only then let submitit requeue them.

submitit (``pip install recovery[submitit]``) runs a pickled callable in its job
process and handles its preemption signal there (``--signal=USR2@90`` in the sbatch
script it writes; ``SUBMITIT_PREEMPT_SIGNAL`` names another): the handler calls the
callable's ``checkpoint()``, pickles the call it returns, runs ``scontrol requeue``
and exits. SIGTERM it ignores ("bypass"). Its handler runs in the middle of whatever
step the loop is in, where recovery never checkpoints
(:mod:`recovery.run.scheduling.preemption`).

:class:`Requeueable` puts the two in order. The run's preemption guard, installed
over submitit's handlers, catches the signal (``checkpoint.preempt_signals`` holds
:func:`preemption_signal` and ``SIGTERM``); the loop checkpoints at the next step
boundary and stops; when the run is closed, :class:`Requeueable` hands the signal
over to submitit's handler (:func:`~recovery.run.scheduling.preemption.handing_over`), whose
``checkpoint()`` resubmits the same call. Since that call resumes ``latest`` from
the first submission, the requeued job continues the checkpoint just made,
bit-identically. A SIGTERM alone (SLURM preempting or requeueing the job itself)
checkpoints the same way and exits ``checkpoint.preempt_exit_code``: SLURM requeues
the job, and submitit starts the call it last pickled, which resumes ``latest``.
"""

from __future__ import annotations

import abc
import os
from typing import Any

from recovery.errors import Preempted
from recovery.run.scheduling import preemption

SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"
"""submitit's own variable naming its preemption signal without ``SIG`` (``USR2``)."""


def preemption_signal() -> str:
    """submitit's preemption signal, as ``checkpoint.preempt_signals`` names it:
    ``SIGUSR2``, or what ``SUBMITIT_PREEMPT_SIGNAL`` names (as submitit reads it).
    ``checkpoint.preempt_signals`` holds it and ``SIGTERM`` (SLURM's notice that it
    preempts or requeues the job); as ``checkpoint.cluster.time_limit_signal`` too
    (submitit sends it 90 s before the time limit), a stop on it is journaled as
    the time limit's."""
    return f"SIG{os.environ.get(SIGNAL_ENV, 'USR2')}"


class Requeueable(abc.ABC):
    """Base of a submitit job whose training loop checkpoints with recovery.

    Implement :meth:`run` (the training: ``with Checkpointer(...)`` and
    ``restore(state, "latest")``, or ``train.py`` with ``+resume=latest``) and submit
    the instance: ``executor.submit(job, *args)``. submitit calls the instance, which
    calls ``run(*args, **kwargs)``, and on its preemption signal calls
    :meth:`checkpoint`, which resubmits the same call. The instance and its arguments
    are pickled by submitit: keep the training state out of them (it lives in the
    run's checkpoints) and make every argument resume, never start afresh.
    """

    @abc.abstractmethod
    def run(self, *args: Any, **kwargs: Any) -> Any:
        """The training run; what it returns is the job's result."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run; after a preemption, hand its signals over to submitit's handlers.

        A :class:`~recovery.errors.Preempted` leaving :meth:`run` (a loop without the
        checkpointer's with-block) ends the process with its exit code, as the
        with-block does, rather than as a failed job: submitit would record it as the
        job's result, and a client waiting on a requeued job would get that error. A
        guard such a run left installed is uninstalled when :meth:`run` ends, and its
        signals handed over all the same; :meth:`run` should still close its
        checkpointer (its journal's ``run_summary``).
        """
        try:
            with preemption.handing_over():
                return self.run(*args, **kwargs)
        except Preempted as stop:
            raise SystemExit(stop.exit_status) from stop

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's requeue protocol: the call to make when the job comes back, the
        same one (it resumes ``latest``). Called by submitit's handler, after the run
        has checkpointed and closed. Returns a ``submitit.helpers.DelayedSubmission``."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)
