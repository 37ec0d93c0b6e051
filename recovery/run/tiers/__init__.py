"""The local tier: snapshots in node-local RAM every few steps, promoted to the run
directory. ``rules`` holds its design and pure policy (where it lives, what fits, which
snapshot a resume takes); ``localtier`` writes and promotes one rank's snapshots in its
directory (``localdir``), checking the room they need (``localroom``); the promotion copies
a snapshot's files (``filepromotion``) or, under ``torchrun``, saves every rank's
collectively (``rankpromotion``); ``peertier`` keeps copies of each rank's snapshot on a
peer.
"""
