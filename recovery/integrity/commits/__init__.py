"""Writing a checkpoint so that nothing half-written is ever taken for one: ``commit``
(temp directory, hash while writing, fsync, sign, rename), ``promote`` (a local
snapshot copied and committed again), ``lock`` (one writer per run directory),
``reaping`` (retired directories deleted in the background), ``full`` (a full disk as one
error) and ``private`` (directories only this user may touch).
"""
