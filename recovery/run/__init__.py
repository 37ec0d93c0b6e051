"""One run's checkpoints, from its start to its end.

:class:`~recovery.run.checkpointer.Checkpointer` is a facade over parts kept in one
package each: ``restoring`` begins a run (choose, verify, load, self-check),
``saving`` decides what a step saves and does what follows a commit, ``tiers`` keeps
the local tier in RAM and promotes from it, ``writing`` writes a save job (inline, in
the background, across ranks), ``scheduling`` knows when to save and the batch job a
run is in, ``monitoring`` watches its steps and per-step records, ``trackers`` follow
the journal. Beside them: the journal, the pure policies and the status the parts
share. ``docs/dev/layout.md`` draws it.
"""
