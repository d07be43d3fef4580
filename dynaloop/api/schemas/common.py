"""Shapes shared by several entities."""

from __future__ import annotations

Label = str | list[str]
"""One label, or a list of labels for multi-label tasks."""
