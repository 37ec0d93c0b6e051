"""How a run begins: the resume chooses its checkpoint (``choose``: ``latest``, a step or
a path, checked against what the journal knows, ``history``), verifies it and loads it into
the state (``begin``), moves newer steps aside when it resumes from an older one
(``branches``) and compares the steps it redoes with the journal (``selfcheck``);
``rundir`` locks and tidies the run directory first, ``checked`` verifies without torch,
and ``sequence`` runs those steps in order for the checkpointer.
"""
