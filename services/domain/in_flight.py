"""Which attempts are with the model right now, in this API process: at most one per
assignment and ``per_writer`` per writer (docs/reliability.md "Model calls").

A writer who sends many attempts at once (a double click, a script) gets the others refused
at once, before anything is saved, instead of filling the model-call slots that every writer
shares. The claim is taken after the attempt is authorized (another writer's assignment is
never reported busy) and held until the model's answer is recorded.

The count is per process: behind N API replicas a writer may have up to N attempts of one
assignment in flight, each still bounded by its replica's model-call slots.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from services.errors import TooManyInFlight

# Seconds a refused writer is told to wait: about one model call.
IN_FLIGHT_RETRY_AFTER_S = 1


class AttemptsInFlight:
    def __init__(self, per_writer: int) -> None:
        self.per_writer = per_writer
        self._lock = threading.Lock()
        self._assignments: set[int] = set()
        self._writers: Counter[int] = Counter()

    @contextmanager
    def claim(self, writer_id: int, assignment_id: int) -> Iterator[None]:
        """Hold the assignment's one slot (and one of the writer's) for the model call, or
        raise :class:`TooManyInFlight` (429) at once."""
        with self._lock:
            if assignment_id in self._assignments:
                raise TooManyInFlight(
                    f"another attempt of assignment {assignment_id} is still being checked with the model; "
                    f"wait for its answer (nothing was saved), then retry in {IN_FLIGHT_RETRY_AFTER_S} s",
                    retry_after_s=IN_FLIGHT_RETRY_AFTER_S,
                )
            if self._writers[writer_id] >= self.per_writer:
                raise TooManyInFlight(
                    f"you already have {self.per_writer} attempts being checked with the model; wait for their "
                    f"answers (nothing was saved), then retry in {IN_FLIGHT_RETRY_AFTER_S} s",
                    retry_after_s=IN_FLIGHT_RETRY_AFTER_S,
                )
            self._assignments.add(assignment_id)
            self._writers[writer_id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._assignments.discard(assignment_id)
                self._writers[writer_id] -= 1
                if self._writers[writer_id] <= 0:
                    del self._writers[writer_id]

    def __len__(self) -> int:
        return len(self._assignments)
