"""A round's builds. Rebuilding a round adds a build and never changes an earlier one; the
newest build is the one that is exported, trained on and evaluated on. The query lives with the
other round use cases (services.domain.rounds), where the pay ledger reads it too."""

from __future__ import annotations

from services.domain.rounds import newest_build

__all__ = ["newest_build"]
