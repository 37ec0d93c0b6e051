"""What a step saves and what follows a commit: ``boundary`` takes each step's decision (a
checkpoint, a local snapshot, a warm-start artifact, a preemption's checkpoint) and hands
the save job to the local tier or the save strategy; ``aftercommit`` links a commit into
the lineage, journals its cost and hands it to DVC; ``retention`` keeps the best copy and
deletes what the policy retires.
"""
