"""Atomic commit and verified reads: ``commits`` (the commit protocol: temp dir, fsync,
hash while writing, sign, rename; the promotion of a local snapshot; the writer's lock;
retired directories deleted; a full disk; private directories), ``reads`` (the verifying
reader, the hash-only check, the signed listing, a delta's chain, DCP's verified reads),
``keys`` (DSSE signing, the trust store, dev keys, the journal's seals), and
``nofollow``, which every writer and reader uses to follow no symlink.
"""
