"""Fairlane: one home GPU, many voices."""

__version__ = "0.1.0"
