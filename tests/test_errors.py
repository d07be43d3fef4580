"""services.errors.validation_problems: pydantic errors as the problems every caller reports."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from pydantic_core import ErrorDetails

from services.errors import REQUEST_PROBLEM_WORDING, validation_problems


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    epochs: int
    kind: Literal["a", "b"] = "a"

    @field_validator("epochs")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("epochs must be at least 1")
        return value


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inner: Inner


def errors_of(data: object) -> list[ErrorDetails]:
    with pytest.raises(ValidationError) as caught:
        Outer.model_validate(data)
    return caught.value.errors()


def test_locations_prefix_and_the_standard_wording() -> None:
    errors = errors_of({"inner": {"colour": 1}})
    assert validation_problems(errors) == ["inner.epochs: is required", "inner.colour: is not a known field; remove it"]
    assert validation_problems(errors, "params") == [
        "params.inner.epochs: is required",
        "params.inner.colour: is not a known field; remove it",
    ]
    assert validation_problems(errors, wording={}) == [
        "inner.epochs: Field required",
        "inner.colour: Extra inputs are not permitted",
    ]


def test_other_kinds_keep_pydantics_message_unless_explained() -> None:
    errors = errors_of({"inner": {"epochs": 0, "kind": "c"}})
    assert validation_problems(errors) == [
        "inner.epochs: Value error, epochs must be at least 1",
        "inner.kind: Input should be 'a' or 'b'",
    ]
    explained = validation_problems(
        errors, explain=lambda e: f"bad {e['input']!r}" if e["type"] == "literal_error" else None
    )
    assert explained == ["inner.epochs: Value error, epochs must be at least 1", "inner.kind: bad 'c'"]


def test_whole_input_errors_and_errors_without_a_location() -> None:
    with pytest.raises(ValidationError) as caught:
        Outer.model_validate_json(b"{not json")
    assert validation_problems(caught.value.errors(), wording=REQUEST_PROBLEM_WORDING) == [
        "the body is not valid JSON (or not UTF-8); send a UTF-8 JSON object"
    ]
    assert validation_problems(errors_of([1])) == ["Input should be a valid dictionary or instance of Outer"]
