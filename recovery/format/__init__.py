"""Bytes on disk: pickle-free trees (codec), tensor files, the manifest (the signed statement's
shape) and the layout (names of files and directories, discovery). Imports nothing above it.
"""
