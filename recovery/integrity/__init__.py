"""integrity."""
