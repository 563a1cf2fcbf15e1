"""Fixtures of the upgrade engine's tests (defined in helpers.py)."""

from __future__ import annotations

from .helpers import operator_factory

__all__ = ["operator_factory"]
