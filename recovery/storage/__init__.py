"""Where checkpoints live beyond the machine: DVC (register, push, pull, dataset versions).
Other stores belong here.
"""
