"""A round's builds. Rebuilding a round adds a build and never changes an earlier one; the
newest build is the one that is exported, trained on and evaluated on."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.db.models import Round, RoundBuild


def newest_build(session: Session, round_: Round) -> RoundBuild | None:
    """The round's most recent build, or None while it has never been built."""
    return session.scalar(
        select(RoundBuild).where(RoundBuild.round_id == round_.id).order_by(RoundBuild.id.desc()).limit(1)
    )
