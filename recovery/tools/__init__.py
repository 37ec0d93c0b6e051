"""User-facing jobs built on the layers below: the drill, export to inference artifacts,
and the audit of an artifact's lineage.
"""
