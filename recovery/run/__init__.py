"""The run's checkpoint lifecycle: the checkpointer decides (when, what, what follows a
commit); the save job is a value; savers choose where it runs; restore and resume choose and
verify what a run starts from; cadence, policy, retention, preemption and the journal.
"""
