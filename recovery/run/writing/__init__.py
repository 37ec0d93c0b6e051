"""How a save job is written: ``job`` is the save as a value (what it holds, where it
goes, how it commits), ``strategies`` where it runs (inline, on the background writer,
across the ranks of a job), ``staging`` the reused host buffers a background save copies
into, ``background`` the one background thread, and ``differential`` which save is a full base
and which a delta.
"""
