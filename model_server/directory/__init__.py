"""`dynaloop_model.json`: what a model directory is for (labels, family, kind, input format, origin).

Every directory the model server loads carries this file next to the model's files: the Hugging
Face files of an ``encoder`` model, or the scikit-learn pipeline of a ``linear`` one
(model_server.directory.linear); the trainer writes it for retrained models and ``dynaloop model init``
for Model 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

METADATA_FILE = "dynaloop_model.json"


class ModelMetadataError(ValueError):
    """A model directory without usable metadata; the message says how to fix it."""


class ModelMetadata(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())

    model_id: str = Field(min_length=1, description="Stable name, e.g. dynasent-r2-model-1.")
    version: str = Field("1", description="Changes whenever the weights change.")
    labels: list[str] = Field(min_length=2, description="Label names in the order of the head's outputs.")
    family: Literal["single_label", "multi_label"] = "single_label"
    kind: Literal["encoder", "linear"] = Field(
        "encoder",
        description="encoder: a Hugging Face sequence classifier; linear: a character and word n-gram "
        "TF-IDF + logistic regression pipeline (model_server.directory.linear).",
    )
    input_format: Literal["text", "text_pair"] = Field(
        "text", description="text_pair: (sentence, target) as in MAD-TSC's SPC scheme."
    )
    threshold: float = Field(0.5, gt=0, lt=1, description="multi_label: a label is predicted above this.")
    exclusive_labels: list[str] = Field(
        default_factory=list,
        description="multi_label: labels never predicted with others (the task's exclusive_labels, e.g. neutral).",
    )
    max_length: int = Field(256, ge=8, le=8192, description="Longer inputs are truncated (and say so).")
    base_model: str = Field("", description="Where the weights started (a path or a hub name).")
    trained_for_round: int | None = None
    task: str | None = None

    @model_validator(mode="after")
    def _unique_labels(self) -> ModelMetadata:
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"labels {self.labels} repeat a name; list each label once")
        unknown = [label for label in self.exclusive_labels if label not in self.labels]
        if unknown:
            raise ValueError(f"exclusive_labels {unknown} are not among labels {self.labels}")
        return self

    @classmethod
    def load(cls, directory: Path | str) -> ModelMetadata:
        path = Path(directory) / METADATA_FILE
        if not path.is_file():
            raise ModelMetadataError(
                f"{directory} has no {METADATA_FILE}; create the directory with `dynaloop model init` "
                "or write the file (model_id, labels, family, input_format)"
            )
        try:
            return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise ModelMetadataError(f"{path} is not valid: {exc}") from exc

    def save(self, directory: Path | str) -> Path:
        path = Path(directory) / METADATA_FILE
        path.write_text(json.dumps(self.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return path

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def multi_label_choice(
    scores: Sequence[float], *, threshold: float, exclusive: Sequence[int] = (), at_least_one: bool = True
) -> list[int]:
    """The label positions a multi-label model predicts from one row of probabilities.

    Every label at or above ``threshold``, with the exclusive labels (``exclusive``: their
    positions; EthioEmo's neutral, "none of the emotions") kept exclusive: when an exclusive
    label has the highest score and passes the threshold, it alone; otherwise the
    non-exclusive labels that pass (an exclusive label that also passes is dropped); when none
    passes, the most probable exclusive label (nothing was detected: "no emotion"). A task
    without exclusive labels and nothing above the threshold gets the most probable label
    when ``at_least_one`` (the model server: a writer needs a prediction to fool), else none
    (evaluation scores the empty set). The model server, evaluation and the round builder's
    model checks share this rule.
    """
    if not len(scores):
        return []
    best = max(range(len(scores)), key=lambda j: scores[j])
    passing = [j for j, score in enumerate(scores) if score >= threshold]
    if best in exclusive and best in passing:
        return [best]
    others = [j for j in passing if j not in exclusive]
    if others:
        return others
    if exclusive:
        return [max(exclusive, key=lambda j: scores[j])]
    return [best] if at_least_one else []
