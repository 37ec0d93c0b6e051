"""When a run saves and the batch job it runs in: ``cadence`` (every N steps, or the
interval planned from measured costs), ``preemption`` (signals turned into a checkpoint at
the next step), ``slurm`` (the job from the environment, how its last run stopped),
``batchjob`` (each start journaled, the job requeued), ``requeue`` (``scontrol``) and
``submitit`` (its checkpointing protocol).
"""
