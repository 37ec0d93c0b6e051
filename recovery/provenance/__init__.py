"""Where an artifact came from: the provenance capture (git, dependencies, data, config,
redaction), lineage links and segments, and the purposes an artifact can serve.
"""
