"""Compact copies of public data sets shipped with the repository (see README.md here)."""
