"""Reading only what was verified: ``listed`` (the signed manifest and the listing checks
every verifier runs first), ``reader`` (verified reads, deferred ones), ``hashonly``
(digests and claims checked without decoding), ``chain`` (a delta's base, found and
verified with it), ``dcp`` (DCP reading verified bytes) and ``notcheckpoint`` (what a
directory that is no checkpoint is told).
"""
