"""Atomic commit and verified reads: the commit protocol (temp dir, fsync, hash while
writing, sign, rename), the verifying reader, DSSE signing and the trust store.
"""
