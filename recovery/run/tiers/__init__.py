"""The local tier: snapshots in node-local RAM every few steps, promoted to the run
directory. ``rules`` holds its design and pure policy (where it lives, what fits, which
snapshot a resume takes); ``snapshots`` writes and promotes one rank's snapshots in its
directory (``directory``), checking the room they need (``room``); a promotion copies a
snapshot's files (``copying``) or, under ``torchrun``, saves every rank's collectively
(``collective``); ``peers`` keeps a copy of each rank's snapshot on another node.
"""
