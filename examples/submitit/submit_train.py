"""train.py as a submitit job on SLURM: preempted or out of time, it checkpoints and comes back.

    pip install -e '.[recipes,submitit]'
    python examples/submitit/submit_train.py --folder submitit-logs train.steps=2000

The job runs ``train.py +resume=latest`` in submitit's job process. submitit's
preemption signal (SIGUSR2, 90 s before the time limit) and SLURM's SIGTERM are
caught by train.py's preemption guard; it checkpoints at the next step boundary,
and only then does submitit call ``checkpoint()`` and requeue the job, which resumes
that checkpoint exactly (:class:`recovery.run.scheduling.submitit.Requeueable`). train.py names
the run after the SLURM job (``slurm-<job id>``), which a requeue keeps; leave
``checkpoint.cluster.requeue`` at ``never``: submitit requeues the job itself.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

import submitit

from recovery.run.scheduling.submitit import Requeueable, preemption_signal

TRAIN = Path(__file__).resolve().parents[2] / "train.py"
"""The project's train.py (Hydra finds its conf/ beside it)."""


class TrainPy(Requeueable):
    """``python train.py +resume=latest OVERRIDES`` inside the submitit job's process."""

    def run(self, *overrides: str) -> None:
        usr = preemption_signal()  # SIGUSR2: submitit's, 90 s before the time limit
        sys.argv = [
            str(TRAIN),
            "+resume=latest",
            f"checkpoint.preempt_signals=[{usr},SIGTERM]",
            f"checkpoint.cluster.time_limit_signal={usr}",  # journaled as "time limit"
            *overrides,
        ]
        sys.path.insert(0, str(TRAIN.parent))  # train.py imports the recipes beside it
        runpy.run_path(str(TRAIN), run_name="__main__")  # as `python train.py ...` would


def executor(folder: Path, *, minutes: int = 60, **parameters: object) -> submitit.SlurmExecutor:
    """A SLURM executor for :class:`TrainPy`: ``--requeue`` (SLURM requeues a preempted
    job itself), submitit's ``--signal=USR2@90`` lead before the time limit."""
    ex = submitit.SlurmExecutor(folder=folder)
    ex.update_parameters(time=minutes, additional_parameters={"requeue": True}, **parameters)
    return ex


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", type=Path, required=True, help="submitit's logs and pickles")
    p.add_argument("--minutes", type=int, default=60, help="the job's time limit")
    p.add_argument("overrides", nargs="*", help="train.py overrides")
    args = p.parse_args()
    job = executor(args.folder, minutes=args.minutes).submit(TrainPy(), *args.overrides)
    print(f"submitted job {job.job_id}; logs in {args.folder}")


if __name__ == "__main__":
    main()
