"""Crowd (researcher): study links for a crowd platform and what came of them.

Per task: a form that makes a study link for a round and a role (``POST /tasks/{task}/study-links``),
the links with the full address to give the platform (this app's address, the link's ``path`` and
its ``query_template``) and a Close button, the crowd report per link (sessions by status,
abandoned ones, the median session in minutes, base pay and bonuses from the ledger and the
effective hourly pay, ``GET /tasks/{task}/crowd-report``), each link's sessions, a button that computes the ledger,
and payout batches: per Prolific or MTurk link, a button that records a batch of the bonuses no batch holds yet
(``POST /tasks/{task}/payout-batches``), the task's batches with their file, Mark paid and Cancel.
The task's pay policy in force, its earlier versions and a form that sets a new version
(``GET``/``PUT /tasks/{task}/pay-policy``), with a warning when the task has none; each worker's
effective hourly pay with a warning where it is below the platform's published minimum or the
policy's own floor (the crowd report's ``workers``).
For a chosen round, each validator's gold accuracy on the task's control items beside their
agreement with the majority (``GET /rounds/{id}/worker-agreement``), and whether they are
still qualified.
Amounts are integers in the currency's minor units; the page formats them, never with floats.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import urlsplit

import pandas as pd
import streamlit as st

from frontend import render, state
from frontend.client import Api, ApiError, Round, StudyLink, Task
from frontend.researcher import choose_task, money

PLATFORMS = ["prolific", "mturk", "generic"]
ROLES = ["writer", "validator"]
OUT_OF_WORK = ["complete", "partial", "return"]  # StudyLink.when_out_of_work
BONUS_PLATFORMS = ["prolific", "mturk"]
STATUSES = ["started", "completed", "screened_out", "stopped", "abandoned"]
BONUS_KEY = "researcher_crowd_batch_files"  # {batch id: the file's bytes}
APP_URL_KEY = "researcher_crowd_app_url"


def app_address() -> str:
    """This app's address as the browser reached it (scheme, host and base path), for the links."""
    url = st.context.url or ""
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""
    return origin + state.base_path()


def full_link(base_url: str, link: StudyLink) -> str:
    return f"{base_url.rstrip('/')}{link['path']}{link.get('query_template') or ''}"


def _iso(day: dt.date | None) -> str | None:
    return None if day is None else dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC).isoformat()


def create_link_form(client: Api, task: Task, rounds: list[Round]) -> None:
    open_rounds = [r for r in rounds if r["status"] in ("collecting", "validating")]
    with st.expander("New study link", expanded=False):
        if not open_rounds:
            st.caption("Open a round on the Tasks and rounds page first.")
            return
        fields = _new_link_fields(open_rounds)
        if fields is not None:
            _create_link(client, task, fields)


def _new_link_fields(open_rounds: list[Round]) -> dict[str, Any] | None:
    """The new study link's form: what it holds once submitted, else None."""
    by_id = {r["id"]: r for r in open_rounds}
    with st.form("researcher_crowd_new_link"):
        name = st.text_input("Name", max_chars=200, key="researcher_crowd_name", placeholder="Pilot, 20 writers")
        cols = st.columns(3)
        round_id = cols[0].selectbox(
            "Round",
            list(by_id),
            key="researcher_crowd_round",
            format_func=lambda rid: f"round {by_id[rid]['number']} ({by_id[rid]['status']})",
        )
        role = cols[1].selectbox("Role", ROLES, key="researcher_crowd_role")
        platform = cols[2].selectbox("Platform", PLATFORMS, key="researcher_crowd_platform")
        cols = st.columns(3)
        quota = cols[0].number_input(
            "Quota (examples per writer, labels per validator)",
            min_value=1,
            max_value=1000,
            value=5,
            key="researcher_crowd_quota",
        )
        max_workers = cols[1].number_input(
            "Most workers (Prolific and MTurk: required; 0: no cap)",
            min_value=0,
            max_value=100_000,
            value=0,
            key="researcher_crowd_max",
        )
        id_parameter = cols[2].text_input(
            "Id parameter (generic only)", max_chars=64, key="researcher_crowd_id_param", placeholder="worker_id"
        )
        dates = st.columns(2)
        opens = dates[0].date_input("Opens on (UTC, optional)", value=None, key="researcher_crowd_opens")
        closes = dates[1].date_input("Closes on (UTC, optional)", value=None, key="researcher_crowd_closes")
        codes = st.columns(2)
        completion_code = codes[0].text_input(
            "Completion code (empty: the API makes one)", max_chars=64, key="researcher_crowd_code"
        )
        screened_code = codes[1].text_input(
            "Screened-out code (optional)", max_chars=64, key="researcher_crowd_screened"
        )
        partial = st.columns(3)
        partial_code = partial[0].text_input(
            "Partial code (optional: stopped workers get it; none: they return the study)",
            max_chars=64,
            key="researcher_crowd_partial_code",
        )
        partial_pay = partial[1].number_input(
            "Partial pay (minor units, with a partial code; 0: none)",
            min_value=0,
            max_value=1_000_000,
            value=0,
            key="researcher_crowd_partial_pay",
        )
        out_of_work = partial[2].selectbox(
            "Validators out of work",
            OUT_OF_WORK,
            key="researcher_crowd_out_of_work",
            help="complete: the completion code once they labelled something; partial: the partial code; "
            "return: they return the study.",
        )
        other_role = st.checkbox(
            "Also take workers who came through a link of the other role",
            key="researcher_crowd_other_role",
        )
        submitted = st.form_submit_button("Create the study link", type="primary", key="researcher_crowd_create")
    if not submitted:
        return None
    return {
        "name": name,
        "round_id": round_id,
        "role": role,
        "platform": platform,
        "quota": quota,
        "max_workers": max_workers,
        "id_parameter": id_parameter,
        "opens": opens,
        "closes": closes,
        "completion_code": completion_code,
        "screened_code": screened_code,
        "partial_code": partial_code,
        "partial_pay": partial_pay,
        "out_of_work": out_of_work,
        "other_role": other_role,
    }


def _create_link(client: Api, task: Task, fields: dict[str, Any]) -> None:
    """The new study link's form submitted: refuse what the API would, else create the link."""
    name, platform, id_parameter = fields["name"], fields["platform"], fields["id_parameter"]
    if not name.strip():
        st.warning("Give the link a name.")
        return
    if platform == "generic" and not id_parameter.strip():
        st.warning("A generic link needs the name of the parameter that carries the worker's id.")
        return
    if platform in ("prolific", "mturk") and not int(fields["max_workers"]):
        st.warning("A Prolific or MTurk link pays its workers: set the most workers it takes.")
        return
    opens, closes = fields["opens"], fields["closes"]
    try:
        link = client.create_study_link(
            task["name"],
            name=name.strip(),
            round_id=int(fields["round_id"]),
            role=str(fields["role"]),
            platform=str(platform),
            quota=int(fields["quota"]),
            max_workers=int(fields["max_workers"]) or None,
            id_parameter=(id_parameter.strip() or None) if platform == "generic" else None,
            opens_at=_iso(opens if isinstance(opens, dt.date) else None),
            closes_at=_iso(closes if isinstance(closes, dt.date) else None),
            completion_code=fields["completion_code"].strip() or None,
            screened_out_code=fields["screened_code"].strip() or None,
            partial_code=fields["partial_code"].strip() or None,
            partial_pay_minor=int(fields["partial_pay"]) or None,
            other_role_allowed=bool(fields["other_role"]),
            when_out_of_work=str(fields["out_of_work"]),
        )
    except ApiError as error:
        state.show_api_error(error)
        return
    state.flash("success", f"Study link {link['name']} created.")
    st.rerun()


def _report_rows(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The crowd report's rows by study link id."""
    rows = report.get("links") or report.get("data") or []
    found: dict[int, dict[str, Any]] = {}
    for row in rows:
        if isinstance(row, dict) and isinstance(row.get("link_id", row.get("id")), int):
            found[int(row.get("link_id", row.get("id")))] = row  # type: ignore[arg-type]
    return found


def _count(row: dict[str, Any], status: str) -> int:
    sessions = row.get("sessions")
    if isinstance(sessions, dict) and status in sessions:
        return int(sessions[status] or 0)
    return int(row.get(status) or 0)


def _minor(row: dict[str, Any], key: str) -> int | None:
    value = row.get(key)
    return int(value) if isinstance(value, int) else None


def link_card(client: Api, link: StudyLink, row: dict[str, Any] | None, currency: str | None, base_url: str) -> None:
    state_text = "open" if link.get("is_open") else ("closed" if link.get("closed_at") else "not open")
    with st.container(border=True):
        st.markdown(
            f"**{render.escape_markdown(link['name'])}** · {link['role']} · {link['platform']} · "
            f"quota {link['quota']} · {state_text}"
        )
        st.code(full_link(base_url, link), language=None)
        if row is not None:
            cols = st.columns(len(STATUSES) + 1)
            for col, status in zip(cols, STATUSES, strict=False):
                col.metric(status.replace("_", " ").capitalize(), f"{_count(row, status):,}")
            median = row.get("median_minutes")
            cols[-1].metric("Median minutes", "–" if median is None else f"{float(median):.1f}")
            pay = st.columns(3)
            pay[0].metric("Base pay", money(_minor(row, "base_pay"), currency))
            pay[1].metric("Bonuses", money(_minor(row, "bonuses"), currency))
            hourly = _minor(row, "effective_hourly_minor")
            pay[2].metric(
                "Effective hourly pay",
                "–" if hourly is None else f"{money(hourly, currency)}/h",
                help="The median over completed sessions of (base pay + the worker's bonuses in the round) per "
                "hour of the session; – until a session is completed.",
            )
            corrections = _minor(row, "corrections")
            if corrections:
                st.caption(f"Corrections in the ledger: {money(corrections, currency)} (counted in the amounts above).")
        if not link.get("closed_at") and st.button("Close", key=f"researcher_crowd_close_{link['id']}"):
            try:
                client.close_study_link(link["id"])
            except ApiError as error:
                state.show_api_error(error)
                return
            state.flash("success", f"Study link {link['name']} closed: no new sessions start from it.")
            st.rerun()


def sessions_table(client: Api, links: list[StudyLink]) -> None:
    by_id = {link["id"]: link for link in links}
    chosen = st.selectbox(
        "Sessions of the link",
        list(by_id),
        key="researcher_crowd_sessions_link",
        format_func=lambda lid: f"{by_id[lid]['name']} ({by_id[lid]['platform']}, {by_id[lid]['role']})",
    )
    try:
        sessions = client.study_link_sessions(int(chosen))
    except ApiError as error:
        state.show_api_error(error)
        return
    if not sessions:
        st.caption("No session yet.")
        return
    st.dataframe(pd.DataFrame(sessions), hide_index=True)


def validator_quality(client: Api, rounds: list[Round]) -> None:
    """Each validator of a round: labels, agreement with the majority, control answers and gold
    accuracy side by side (a validator below the task's gold threshold is unqualified)."""
    st.subheader("Validators: gold accuracy and agreement")
    if not rounds:
        st.caption("No round yet.")
        return
    by_id = {r["id"]: r for r in rounds}
    chosen = st.selectbox(
        "Round",
        list(by_id),
        index=len(by_id) - 1,
        key="researcher_crowd_quality_round",
        format_func=lambda rid: f"Round {by_id[rid]['number']} ({by_id[rid]['status']})",
    )
    try:
        rows = client.worker_agreement(int(chosen))
    except ApiError as error:
        state.show_api_error(error)
        return
    if not rows:
        st.caption("No validator has labelled in this round yet.")
        return

    def share(value: float | None) -> str:
        return "–" if value is None else f"{value:.0%}"

    table = pd.DataFrame(
        [
            {
                "validator": row["username"],
                "labels": row["labels"],
                "agreement with the majority": share(row["agreement_rate"]),
                "control answers": row.get("control_answers", 0),
                "gold accuracy": share(row.get("gold_accuracy")),
                "qualified": "yes" if row["qualified"] else "no",
            }
            for row in rows
        ]
    )
    st.dataframe(table, hide_index=True)


def writer_attention(client: Api, task: Task) -> None:
    """Each writer's attention checks on the task (only for a task that has them): a writer at
    the task's failure limit is unqualified and their study session screened out."""
    if not task["definition"].get("attention_checks"):
        return
    st.subheader("Writers: attention checks")
    try:
        report = client.task_attention_checks(task["name"])
    except ApiError as error:
        state.show_api_error(error)
        return
    st.caption(
        f"One check after every {report['every_n_assignments']} finished assignments; "
        f"{report['fails_to_screen_out']} failed checks unqualify a writer."
    )
    if not report["data"]:
        st.caption("No writer has been served a check yet.")
        return
    table = pd.DataFrame(
        [
            {
                "writer": row["username"],
                "served": row["served"],
                "answered": row["answered"],
                "passed": row["passed"],
                "failed": row["failed"],
                "qualified": "yes" if row["qualified"] else "no",
            }
            for row in report["data"]
        ]
    )
    st.dataframe(table, hide_index=True)


def _policy_line(policy: dict[str, Any]) -> str:
    currency = policy.get("currency")
    base = policy.get("base_pay") or {}
    parts = [
        f"base pay: writers {money(base.get('writer', 0), currency)}, "
        f"validators {money(base.get('validator', 0), currency)} per completed session",
        f"writer bonus {money(policy.get('writer_bonus_per_example', 0), currency)} per validated example "
        "that fooled the model",
    ]
    bonus = policy.get("validator_bonus")
    if bonus:
        parts.append(
            f"validator bonus {money(bonus.get('per_batch', 0), currency)} per batch with at least "
            f"{float(bonus.get('min_agreement', 0)):.0%} agreement"
        )
    if policy.get("min_hourly_minor") is not None:
        parts.append(f"hourly floor {money(policy['min_hourly_minor'], currency)}/h")
    return "; ".join(parts)


def pay_policy_section(client: Api, task: Task) -> None:
    """The policy in force, its versions, and a form for a new version (it pays work done from now on)."""
    st.subheader("Pay policy")
    try:
        answer = client.pay_policy(task["name"])
    except ApiError as error:
        state.show_api_error(error)
        return
    current = answer.get("current")
    policy = _policy_in_force(answer)
    locked = answer.get("ledger_currency")
    with st.expander("Set a new pay policy" if current else "Set the pay policy", expanded=current is None):
        st.caption(
            "Amounts are whole numbers in minor units (pence, cents). The new version pays work done from now "
            "on; rows already in the ledger never change."
            + (f" The currency stays {locked}: the ledger has rows in it." if locked else "")
        )
        submitted = _new_policy_form(policy, locked)
        if submitted is not None:
            new_policy, note = submitted
            _save_pay_policy(client, task, new_policy, note)


def _policy_in_force(answer: dict[str, Any]) -> dict[str, Any]:
    """Show the policy in force and its earlier versions (a warning where the task has none); the
    policy in force, empty where there is none."""
    current = answer.get("current")
    if current is None:
        st.warning(
            "This task has no pay policy: no ledger is computed, the amounts on this page stay at 0.00 and "
            "workers get nothing beyond the platform's own reward. Set a policy below."
        )
        policy: dict[str, Any] = {}
    else:
        policy = dict(current["policy"])
        st.markdown(
            f"**Version {current['version']}**, in force since {current['effective_from']} (UTC): "
            + render.escape_markdown(_policy_line(policy))
        )
        if len(answer.get("versions") or []) > 1:
            with st.expander("Earlier versions"):
                st.table(
                    pd.DataFrame(
                        [
                            {
                                "version": v["version"],
                                "in force from (UTC)": v["effective_from"],
                                "policy": _policy_line(v["policy"]),
                                "note": v["note"],
                            }
                            for v in answer["versions"]
                        ]
                    )
                )
    return policy


def _new_policy_form(policy: dict[str, Any], locked: str | None) -> tuple[dict[str, Any], str] | None:
    """The form for a new version of the pay policy, filled in from ``policy``: once submitted, the
    new policy and the note kept with it; else None. ``locked``: the ledger's currency, which the
    policy keeps."""
    base = policy.get("base_pay") or {}
    bonus = policy.get("validator_bonus") or {}
    with st.form("researcher_crowd_pay_policy"):
        cols = st.columns(4)
        currency = cols[0].text_input(
            "Currency (ISO 4217)",
            value=str(locked or policy.get("currency") or "GBP"),
            max_chars=3,
            disabled=bool(locked),
            key="researcher_crowd_pay_currency",
        )
        writer = cols[1].number_input(
            "Writer base pay", 0, 1_000_000, int(base.get("writer", 0)), key="researcher_crowd_pay_writer"
        )
        validator = cols[2].number_input(
            "Validator base pay", 0, 1_000_000, int(base.get("validator", 0)), key="researcher_crowd_pay_validator"
        )
        per_example = cols[3].number_input(
            "Writer bonus per example",
            0,
            1_000_000,
            int(policy.get("writer_bonus_per_example", 0)),
            key="researcher_crowd_pay_bonus",
        )
        more = st.columns(3)
        per_batch = more[0].number_input(
            "Validator bonus per batch (0: none)",
            0,
            1_000_000,
            int(bonus.get("per_batch", 0)),
            key="researcher_crowd_pay_batch",
        )
        agreement = more[1].number_input(
            "Agreement a batch needs",
            0.01,
            1.0,
            float(bonus.get("min_agreement", 0.8)),
            0.05,
            key="researcher_crowd_pay_agreement",
        )
        floor = more[2].number_input(
            "Hourly floor (0: none)",
            0,
            1_000_000,
            int(policy.get("min_hourly_minor") or 0),
            key="researcher_crowd_pay_floor",
            help="Your own minimum effective hourly pay; MTurk publishes none.",
        )
        note = st.text_input("Why (kept with the version)", max_chars=500, key="researcher_crowd_pay_note")
        submitted = st.form_submit_button("Save as a new version", key="researcher_crowd_pay_save")
    if not submitted:
        return None
    new_policy: dict[str, Any] = {
        "currency": (locked or currency).strip().upper(),
        "base_pay": {"writer": int(writer), "validator": int(validator)},
        "writer_bonus_per_example": int(per_example),
    }
    if int(per_batch):
        new_policy["validator_bonus"] = {"per_batch": int(per_batch), "min_agreement": float(agreement)}
    if int(floor):
        new_policy["min_hourly_minor"] = int(floor)
    return new_policy, note.strip()


def _save_pay_policy(client: Api, task: Task, new_policy: dict[str, Any], note: str) -> None:
    """Save the new version of the pay policy; it is in force from now on."""
    try:
        saved = client.set_pay_policy(task["name"], new_policy, note)
    except ApiError as error:
        state.show_api_error(error)
        return
    state.flash("success", f"Pay policy version {saved['current']['version']} is in force from now on.")
    st.rerun()


def hourly_pay(report: dict[str, Any]) -> None:
    """Each worker's effective hourly pay (ledger total per hour of their sessions' active time),
    with the crowd report's warning where it is below the platform's minimum or the policy's floor."""
    workers = report.get("workers") or []
    if not workers:
        return
    currency = report.get("currency")
    st.subheader("Effective hourly pay per worker")
    below = [w for w in workers if w.get("below_minimum")]
    if below:
        st.warning(
            f"{len(below)} worker(s) earn less per hour than the platform's published minimum or the policy's "
            "floor: pay them the difference as a bonus (a ledger correction) or raise the policy."
        )
    st.table(
        pd.DataFrame(
            [
                {
                    "worker": w["username"],
                    "platforms": ", ".join(w["platforms"]),
                    "active minutes": f"{w['active_seconds'] / 60:.1f}",
                    "earned": money(w["earned_minor"], currency),
                    "per hour": money(w["effective_hourly_minor"], currency),
                    "minimum": money(w["platform_minimum_minor"], currency),
                    "warning": w.get("warning") or "",
                }
                for w in workers
            ]
        )
    )


def ledger_controls(client: Api, task: Task, links: list[StudyLink]) -> None:
    st.subheader("Ledger and payout batches")
    _compute_ledger_button(client, task)
    st.caption(
        "A payout batch records one study's bonuses that no earlier batch holds: paste its file into the "
        "platform (one file per Prolific study or MTurk HIT group), then mark it paid. Cancel a batch that "
        "was never paid and its bonuses are payable again."
    )
    _create_batch_buttons(client, task, links)
    _payout_batches(client, task, links)


def _compute_ledger_button(client: Api, task: Task) -> None:
    """A button that adds the ledger rows the pay policy gives and nobody was paid yet."""
    if st.button("Compute the ledger", key="researcher_crowd_compute"):
        try:
            computed = client.compute_ledger(task["name"])
        except ApiError as error:
            state.show_api_error(error)
        else:
            added, already = int(computed.get("entries_added") or 0), int(computed.get("already_paid") or 0)
            amount = money(int(computed.get("amount_added_minor") or 0), computed.get("currency"))
            state.flash("success", f"Ledger computed: {added} new row(s), {amount}; {already} event(s) paid already.")
            st.session_state.pop(BONUS_KEY, None)
            st.rerun()


def _create_batch_buttons(client: Api, task: Task, links: list[StudyLink]) -> None:
    """Per Prolific or MTurk link, a button that records a payout batch of the bonuses no batch holds."""
    payable = [link for link in links if link["platform"] in BONUS_PLATFORMS]
    for link in payable:
        label = (
            f"Create a payout batch for {render.escape_markdown(link['name'])} ({link['platform']}, link {link['id']})"
        )
        if st.button(label, key=f"researcher_crowd_batch_create_{link['id']}"):
            try:
                created = client.create_payout_batch(task["name"], int(link["id"]))
            except ApiError as error:
                state.show_api_error(error)
            else:
                batch = created["batch"]
                notes = [f"{h['username']}: {h['reason']}" for h in created.get("held_back") or []]
                notes += [f"{', '.join(e['usernames'])}: {e['advice']}" for e in created.get("elsewhere") or []]
                notes = [render.escape_markdown(note) for note in notes]
                message = (
                    f"Payout batch {batch['id']}: {batch['line_count']} line(s), "
                    f"{money(int(batch['total_minor']), batch['currency'])}."
                )
                state.flash("success", message + ("\n\nNot in this batch: " + "; ".join(notes) if notes else ""))
                st.rerun()


def _payout_batches(client: Api, task: Task, links: list[StudyLink]) -> None:
    """The task's payout batches, each with its file, Mark paid and Cancel."""
    try:
        batches = client.payout_batches(task["name"])
    except ApiError as error:
        state.show_api_error(error)
        return
    if not batches:
        st.caption("No payout batch yet.")
        return
    names = {link["id"]: link["name"] for link in links}
    table = pd.DataFrame(
        [
            {
                "batch": b["id"],
                "link": names.get(b["link_id"], b["link_id"]),
                "platform": b["platform"],
                "status": b["status"],
                "lines": b["line_count"],
                "total": money(int(b["total_minor"]), b["currency"]),
                "created": b["created_at"],
            }
            for b in batches
        ]
    )
    st.dataframe(table, hide_index=True)
    files: dict[int, bytes] = st.session_state.setdefault(BONUS_KEY, {})
    for b in batches:
        _batch_row(client, b, files)


def _batch_row(client: Api, b: dict[str, Any], files: dict[int, bytes]) -> None:
    """One payout batch: its file (prepared once, then downloaded), and while it is created, Mark paid and Cancel."""
    cols = st.columns(4)
    cols[0].write(f"Batch {b['id']} ({b['status']})")
    if b["id"] in files:
        cols[1].download_button(
            f"Download ({len(files[b['id']]):,} bytes)",
            data=files[b["id"]],
            file_name=b["filename"],
            mime="text/csv",
            key=f"researcher_crowd_batch_download_{b['id']}",
            icon=":material/download:",
        )
    elif cols[1].button("Prepare the file", key=f"researcher_crowd_batch_file_{b['id']}"):
        try:
            files[b["id"]] = client.payout_batch_file(int(b["id"]))
        except ApiError as error:
            state.show_api_error(error)
        else:
            st.rerun()
    if b["status"] != "created":
        return
    if cols[2].button("Mark paid", key=f"researcher_crowd_batch_paid_{b['id']}"):
        try:
            client.mark_payout_batch_paid(int(b["id"]))
        except ApiError as error:
            state.show_api_error(error)
        else:
            state.flash("success", f"Payout batch {b['id']} marked paid.")
            st.rerun()
    if cols[3].button("Cancel", key=f"researcher_crowd_batch_cancel_{b['id']}"):
        try:
            client.cancel_payout_batch(int(b["id"]))
        except ApiError as error:
            state.show_api_error(error)
        else:
            state.flash("success", f"Payout batch {b['id']} cancelled: its bonuses are payable again.")
            st.rerun()


def main() -> None:
    client = state.require_role("researcher")
    st.title("Crowd")
    state.show_flash()
    task = choose_task(client, "researcher_crowd_task")
    if task is None:
        st.info("No task yet: create one on the Tasks and rounds page.")
        return
    try:
        rounds = client.rounds(task["name"])
        links = client.study_links(task["name"])
    except ApiError as error:
        state.show_api_error(error)
        return
    pay_policy_section(client, task)
    create_link_form(client, task, rounds)
    base_url = st.text_input(
        "This app's address as workers reach it",
        value=st.session_state.get(APP_URL_KEY) or app_address(),
        max_chars=300,
        key="researcher_crowd_base_url",
        help="The study links below start with it; give the platform the full link.",
    )
    st.session_state[APP_URL_KEY] = base_url
    if not base_url.startswith(("https://", "http://")):
        st.warning("Type this app's public address above (https://...): the platform needs full links.")
    if not links:
        st.info("No study link for this task yet.")
    else:
        try:
            report = client.crowd_report(task["name"])
        except ApiError as error:
            state.show_api_error(error)
            report = {}
        rows = _report_rows(report)
        currency = report.get("currency")
        for link in links:
            link_card(client, link, rows.get(link["id"]), currency, base_url)
        hourly_pay(report)
        sessions_table(client, links)
    validator_quality(client, rounds)
    writer_attention(client, task)
    ledger_controls(client, task, links)


main()
