"""Audit log of researcher and admin actions."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from services.db.models import AuditEntry, User


def record(
    session: Session, actor: User | None, action: str, target_type: str, target_id: object, **details: Any
) -> None:
    session.add(
        AuditEntry(
            actor_id=actor.id if actor else None,
            action=action,
            target_type=target_type,
            target_id=str(target_id),
            details=details,
        )
    )
