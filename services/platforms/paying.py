"""One entry point for paying a payout batch through its platform's API, for `dynaloop ledger
pay BATCH` (the payout batches of services/domain/ledger.py map onto these plain values: the
batch's platform, its Prolific study id, its currency and lines, and the Prolific state the
batch keeps). Each line's :class:`~services.platforms.LineResult` is what the batch records per
line (status, platform reference, answer)."""

from __future__ import annotations

from collections.abc import Callable

from services.db.models import Platform
from services.errors import Invalid
from services.platforms import LineResult, PayLine, mturk, prolific
from services.settings import Settings


def pay_batch(
    settings: Settings,
    platform: Platform,
    *,
    currency: str,
    lines: list[PayLine],
    prolific_study_id: str | None = None,
    prolific_state: prolific.BonusPayment | None = None,
    save_prolific_state: Callable[[prolific.BonusPayment], None] | None = None,
) -> list[LineResult]:
    """Pay ``lines`` on ``platform``: Prolific as one bulk bonus of ``prolific_study_id`` (the
    batch's ``prolific_state`` saved through ``save_prolific_state`` before each next request,
    see :func:`services.platforms.prolific.pay_lines`); MTurk one ``send_bonus`` per line with its
    token (USD only). The client is made from settings here: nothing else picks its address."""
    if platform is Platform.prolific:
        if prolific_study_id is None or prolific_state is None or save_prolific_state is None:
            raise Invalid("paying on Prolific needs the batch's study id and its saved bonus state")
        with prolific.ProlificClient(settings) as client:
            return prolific.pay_lines(client, prolific_study_id, currency, lines, prolific_state, save_prolific_state)
    if platform is Platform.mturk:
        if currency != "USD":
            raise Invalid(f"MTurk pays in USD only; this batch is in {currency} (nothing was sent)")
        return mturk.pay_lines(mturk.boto3_client(settings), lines)
    raise Invalid(f"{platform.value} has no payment API: pay these workers by hand")
