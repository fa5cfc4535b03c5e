"""Targets: the model whose output is final."""

from assistd.targets.base import Target

__all__ = ["Target"]
