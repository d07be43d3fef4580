"""The platforms' own records of what they paid, read for reconciling a payout batch
(services/domain/payouts.py ``reconcile``): a CSV with a header naming a worker (participant) id
column and an amount column (MTurk: and an assignment id column), a Prolific bulk-bonus file
without a header, or the JSON of MTurk's ListBonusPayments. Read here, beside the other bounded
readers of uploaded tables (rounds/models/bounded_tables.py), because the services layer does not
import rounds.models (pyproject.toml, [tool.importlinter])."""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation

from rounds.models.bounded_tables import ReadBounds, TooMuchData, read_table
from rounds.models.datasets import DataError
from services.db.models import Platform
from services.domain.payouts import MAX_RECONCILE_CELL_CHARS, RecordRow
from services.errors import Invalid, TooLarge
from services.settings import Settings
from services.structured_input import check_json_depth
from services.taskdef import currency_digits

WORKER_COLUMNS = ("participantid", "participant", "prolificpid", "workerid")
ASSIGNMENT_COLUMNS = ("assignmentid",)
AMOUNT_COLUMNS = ("amount", "bonus", "bonusamount", "bonuspaid")
_PROLIFIC_BARE_LINE = re.compile(rb"\s*[0-9a-fA-F]{24}\s*,")
_AMOUNT = re.compile(r"(?:[$£]|USD|GBP)?\s*(\d{1,9})(?:\.(\d{1,3}))?")


def _fold(name: str) -> str:
    return re.sub(r"[\s_\-]", "", str(name)).lower()


def _amount_minor(text: str, currency: str, row: int) -> int:
    """An amount in major units ("0.25", "$0.25") as integer minor units, by decimal arithmetic
    (never a float); more decimals than the currency has is refused."""
    match = _AMOUNT.fullmatch(text.strip())
    digits = currency_digits(currency)
    if match is None or len(match.group(2) or "") > digits:
        raise Invalid(f"row {row}: the amount {text[:40]!r} is not an amount in {currency} (e.g. 1.50)")
    try:
        value = Decimal(f"{match.group(1)}.{match.group(2) or '0'}")
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits only digits
        raise Invalid(f"row {row}: the amount {text[:40]!r} is not a number") from exc
    return int(value.scaleb(digits))


def parse_record(body: bytes, platform: Platform, currency: str, bounds: ReadBounds) -> list[RecordRow]:
    """The platform's record of paid bonuses: a CSV with a header naming a worker (participant)
    id column and an amount column (MTurk: and an assignment id column); a Prolific bulk-bonus
    file without a header (``participant_id,amount`` lines); or, for MTurk, the JSON that
    ListBonusPayments answers (``{"BonusPayments": [...]}``). Read within ``bounds``."""
    if not body.strip():
        raise Invalid("the platform's record is empty; send the file's bytes as the request body")
    if len(body) > bounds.max_decoded_bytes:
        raise TooLarge(
            f"the platform's record is {len(body):,} bytes, more than the {bounds.max_decoded_bytes:,} allowed"
        )
    if platform is Platform.mturk and body.lstrip()[:1] == b"{":
        return _parse_list_bonus_payments(body, currency, bounds)
    if platform is Platform.prolific and _PROLIFIC_BARE_LINE.match(body):
        body = b"participant_id,amount\n" + body
    try:
        frame = read_table(body, "the platform's record", "csv", bounds)
    except TooMuchData as exc:
        raise TooLarge(str(exc)) from exc
    except DataError as exc:
        raise Invalid(str(exc)) from exc
    folded = {_fold(c): c for c in frame.columns}
    worker = next((folded[c] for c in WORKER_COLUMNS if c in folded), None)
    amount = next((folded[c] for c in AMOUNT_COLUMNS if c in folded), None)
    assignment = next((folded[c] for c in ASSIGNMENT_COLUMNS if c in folded), None)
    needed = ["a worker id (participant_id, WorkerId)", "an amount (amount, BonusAmount)"]
    if platform is Platform.mturk:
        needed.append("an assignment id (AssignmentId)")
    if worker is None or amount is None or (platform is Platform.mturk and assignment is None):
        raise Invalid(
            f"the platform's record needs a header with {', '.join(needed)}; its columns are "
            f"{[str(c)[:40] for c in list(frame.columns)[:20]]}"
        )
    rows = []
    for index, record in enumerate(frame.to_dict("records"), start=1):
        worker_id = str(record[worker] if record[worker] is not None else "").strip()
        if not worker_id or worker_id == "nan":
            raise Invalid(f"row {index}: no worker id")
        assignment_id = str(record[assignment]).strip() if assignment is not None else None
        rows.append(RecordRow(index, worker_id, assignment_id, _amount_minor(str(record[amount]), currency, index)))
    return rows


def _parse_list_bonus_payments(body: bytes, currency: str, bounds: ReadBounds) -> list[RecordRow]:
    # ListBonusPayments' answer nests three deep ({"BonusPayments": [{...}]}); deeper is refused
    # before it is parsed (TooDeep, 422).
    check_json_depth(body, 4, "the platform's record")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Invalid(f"the platform's record is not JSON: {str(exc)[:200]}") from exc
    payments = data.get("BonusPayments") if isinstance(data, dict) else None
    if not isinstance(payments, list):
        raise Invalid('the platform\'s record needs "BonusPayments": a list, as ListBonusPayments answers')
    if len(payments) > bounds.max_rows:
        raise Invalid(
            f"the platform's record has {len(payments):,} payments, more than the {bounds.max_rows:,} allowed"
        )
    rows = []
    for index, payment in enumerate(payments, start=1):
        fields = (
            (payment.get("WorkerId"), payment.get("AssignmentId"), payment.get("BonusAmount"))
            if isinstance(payment, dict)
            else (None, None, None)
        )
        if not all(isinstance(value, str) and 0 < len(value) <= 128 for value in fields):
            raise Invalid(
                f"payment {index}: WorkerId, AssignmentId and BonusAmount must be strings of 1-128 characters"
            )
        worker_id, assignment_id, amount = (str(value) for value in fields)
        rows.append(RecordRow(index, worker_id, assignment_id, _amount_minor(amount, currency, index)))
    return rows


def record_bounds(settings: Settings) -> ReadBounds:
    """The bounds a platform's record is read within: the upload bounds, and at most
    MAX_RECONCILE_CELL_CHARS characters a cell (ids and amounts are short)."""
    return ReadBounds(
        max_rows=settings.max_upload_rows,
        max_decoded_bytes=settings.max_upload_decoded_bytes,
        max_cell_chars=min(settings.max_upload_cell_chars, MAX_RECONCILE_CELL_CHARS),
    )
