"""The package version: one place, read by the package, provenance and the build."""

__version__ = "0.1.0"
