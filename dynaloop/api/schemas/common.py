"""Shapes shared by several entities."""

from __future__ import annotations

from pydantic import ConfigDict

Label = str | list[str]
"""One label, or a list of labels for multi-label tasks."""


# For the models of answers that are sent whole (every field, null or not; not with
# ``response_model_exclude_unset``): the OpenAPI document then lists each of their fields as
# required, nullable where it may be null, and a client generated from it does not type a field
# that is always there as one that may be missing (tests/test_openapi.py).
ANSWER_CONFIG = ConfigDict(json_schema_serialization_defaults_required=True)
