"""Models and datasets (researcher): build a closed round, train the next model, evaluate and
promote it, and download the dataset and its report.

Building is quick and synchronous (``POST /rounds/{id}/build``). Training, evaluation and
promotion are *jobs* (``POST /tasks/{task}/jobs``): a worker runs each in its own process and
this page polls ``GET /jobs/{id}`` every couple of seconds (an ``st.fragment`` with
``run_every``) to move a progress bar until the job succeeds, fails or is cancelled (its
Cancel button: ``POST /jobs/{id}/cancel``). The newest finished job of each kind, when it
failed, is shown at the top of the page with its error and log (polled too while a job of the
task is queued or running). A promotion the API refuses as worse (409 ``confirm_worse``: below
the promoted model on a round's dev split, or near chance) shows both scores and asks: *Promote
anyway* sends it again with ``confirm_worse``, *Do not promote* drops it. The forms that start a
job do not submit on Enter.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from frontend import render, state
from frontend.client import Api, ApiError, Job, Model, Round, Task
from frontend.researcher import choose_round, choose_task

ACTIVE_JOB_KEY = "researcher_models_job"  # {task: job id} of the job this page follows
MODEL_KEY = "researcher_models_model"  # the model picker of the registry
NEXT_MODEL_KEY = "researcher_models_next_model"  # a model the picker shows at its next drawing
WORSE_KEY = "researcher_models_confirm_worse"  # {task: {"params", "message", "details"}} of a refused promotion
DOWNLOAD_KEY = "researcher_models_download"  # the fetched file: {"name", "data", "mime"}
POLL_SECONDS = 2.0
FOLLOWERS = ""  # the promote form's choice "no server": every replica that follows the task (docs/deploy.md)
SPLITS = ["train", "dev", "test", "excluded", "all"]
JOB_KINDS = ("train", "evaluate", "promote")
FINISHED = ("succeeded", "failed", "cancelled")
FORMATS = {"jsonl": "application/x-ndjson", "csv": "text/csv", "parquet": "application/vnd.apache.parquet"}


# --- jobs --------------------------------------------------------------------------------


def start(client: Api, task: str, kind: str, params: dict[str, Any]) -> None:
    try:
        job = client.start_job(task, kind, params)
    except ApiError as error:
        if error.code == "confirm_worse" and kind == "promote":
            st.session_state.setdefault(WORSE_KEY, {})[task] = {
                "params": params,
                "message": error.message,
                "details": error.details,
            }
            return  # the page shows the refusal and asks (confirm_worse)
        state.show_api_error(error)
        return
    st.session_state.setdefault(ACTIVE_JOB_KEY, {})[task] = job["id"]
    st.rerun()


def _job_text(job: Job) -> str:
    return render.escape_markdown(f"{job['kind']} job {job['id']}: {job.get('message') or job['status']}")


def follow_job(client: Api, task: str) -> None:
    """The followed job's progress bar; polls while it is queued or running."""
    job_id = st.session_state.get(ACTIVE_JOB_KEY, {}).get(task)
    if job_id is None:
        return
    try:
        job = client.job(job_id)
    except ApiError as error:
        state.show_api_error(error)
        return
    if job["status"] in ("queued", "running"):
        st.progress(min(max(float(job.get("progress") or 0.0), 0.0), 1.0), text=_job_text(job))
        if st.button("Cancel this job", key=f"researcher_cancel_job_{job_id}"):
            try:
                client.cancel_job(job_id)
            except ApiError as error:
                state.show_api_error(error)
        return
    st.session_state[ACTIVE_JOB_KEY].pop(task, None)
    if job["status"] == "cancelled":
        state.flash("warning", _job_text(job))
    elif job["status"] == "succeeded":
        state.flash("success", _job_text(job))
        trained = (job.get("result") or {}).get("model") if job["kind"] == "train" else None
        if isinstance(trained, dict) and isinstance(trained.get("id"), int):
            # The model just trained is the one to evaluate next: the picker shows it. This may be
            # a run of this fragment alone, after the picker was drawn with the old choice, so the
            # choice is handed to the next full run, which sets it before drawing the picker.
            st.session_state[NEXT_MODEL_KEY] = trained["id"]
    # A failed job is shown at the top of the page with its log (failed_jobs).
    st.rerun()  # the whole page: the registry and the job list changed


def job_progress(client: Api, task: str) -> None:
    following = st.session_state.get(ACTIVE_JOB_KEY, {}).get(task) is not None
    st.fragment(follow_job, run_every=POLL_SECONDS if following else None)(client, task)


def newest_failed_jobs(client: Api, task: str) -> list[Job]:
    """Of each kind, the newest finished job (succeeded, failed or cancelled) when it failed,
    newest first."""
    failed = []
    for kind in JOB_KINDS:
        finished = next((j for j in client.jobs(task, kind=kind, limit=10) if j["status"] in FINISHED), None)
        if finished is not None and finished["status"] == "failed":
            failed.append(finished)
    return sorted(failed, key=lambda j: j["id"], reverse=True)


def show_failed_jobs(client: Api, task: str) -> None:
    """Each kind's newest finished job, when it failed: its error and its log."""
    try:
        failed = newest_failed_jobs(client, task)
        logs = {job["id"]: client.job(job["id"]).get("log") for job in failed}
    except ApiError as error:
        state.show_api_error(error)
        return
    for job in failed:
        render.alert("error", f"{job['kind']} job {job['id']}: {job.get('message') or 'failed'}")
        with st.expander(f"Log of the failed {job['kind']} job {job['id']}"):
            st.code(logs.get(job["id"]) or "(empty log)", language=None)


def failed_jobs(client: Api, task: str) -> None:
    """The failed jobs at the top of the page, polled while a job of the task is queued or running."""
    try:
        active = any(j["status"] not in FINISHED for j in client.jobs(task, limit=20))
    except ApiError as error:
        state.show_api_error(error)
        return
    st.fragment(show_failed_jobs, run_every=POLL_SECONDS if active else None)(client, task)


def jobs_table(client: Api, task: str) -> None:
    try:
        jobs = client.jobs(task, limit=20)
    except ApiError as error:
        state.show_api_error(error)
        return
    if not jobs:
        return
    with st.expander(f"Recent jobs ({len(jobs)})"):
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "id": j["id"],
                        "kind": j["kind"],
                        "status": j["status"],
                        "progress": j.get("progress"),
                        "message": j.get("message"),
                        "by": j.get("created_by"),
                        "started": j.get("started_at"),
                        "finished": j.get("finished_at"),
                    }
                    for j in jobs
                ]
            ),
            hide_index=True,
            key="researcher_models_jobs",
            column_config={"progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0)},
        )
        failed = [j for j in jobs if j["status"] == "failed"]
        if failed:
            chosen = st.selectbox("Log of the failed job", [j["id"] for j in failed], key="researcher_models_log_job")
            try:
                detail = client.job(chosen)
            except ApiError as error:
                state.show_api_error(error)
                return
            st.code(detail.get("log") or "(empty log)", language=None)


# --- build -------------------------------------------------------------------------------

DEFAULT = "default"  # a policy control left at the policy's own default (not sent)
GUARD_SHARES = [0.5, 0.6, 0.7, 0.8, 1.0]  # the class-balance guard's choices (rounds.build.preview)
NOTHING_BUILDS = (
    "No option builds this round, and a closed round takes no more examples or labels: collect them in "
    "the next round (Tasks and rounds), or bring a labelled dataset or crowd responses in as a round "
    "(`dynaloop round import`, docs/round_builder.md, Imports)."
)


def build_settings(seed: int, policy: str, chance: str, votes: int | str, share: float | str) -> dict[str, Any]:
    """The build body of the page's policy controls; a control left at ``DEFAULT`` is not sent,
    so the policy's own default applies (docs/round_builder.md, "Build policies")."""
    settings: dict[str, Any] = {"seed": int(seed)}
    if policy != DEFAULT:
        settings["policy"] = policy
    if chance != DEFAULT:
        settings["chance"] = chance == "yes"
    if votes != DEFAULT:
        settings["dev_test_min_votes"] = int(votes)
    if share != DEFAULT:
        settings["max_dev_test_share"] = float(share)
    return settings


def settings_text(settings: dict[str, Any]) -> str:
    """``policy=relaxed, chance=false, max_dev_test_share=0.7``: the options a row builds with."""
    return (
        ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items() if k != "seed")
        or "defaults"
    )


def options_frame(previews: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per option that builds: its dev, test and train counts and each class's
    train/dev/test counts."""
    return pd.DataFrame(
        [
            {
                "option": r["name"],
                "settings": settings_text(r["settings"]),
                "dev": r["counts"]["dev"],
                "test": r["counts"]["test"],
                "train": r["counts"]["train"],
                "per": f"{r['dev_per_cell']} per {r['unit']}",
                **{f"{c} train/dev/test": f"{v['train']}/{v['dev']}/{v['test']}" for c, v in r["classes"].items()},
            }
            for r in previews
            if r.get("feasible")
        ]
    )


def refused_frame(previews: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per option that does not build: what refuses it and why."""
    return pd.DataFrame(
        [
            {"option": r["name"], "refused by": r.get("constraint") or "", "why": r.get("message") or ""}
            for r in previews
            if not r.get("feasible")
        ]
    )


def policy_controls(task: Task) -> dict[str, Any]:
    """The seed and the build policy's settings; the build body they make."""
    definition = task.get("definition") or {}
    agreement = definition.get("agreement") or {}
    responses = int(definition.get("validations_per_example") or 5)
    task_votes = int(agreement.get("dev_test_min_votes") or responses)
    cols = st.columns(5)
    seed = cols[0].number_input(
        "Seed", min_value=0, max_value=2**31 - 1, value=0, step=1, key="researcher_models_build_seed"
    )
    policy = cols[1].selectbox(
        "Policy",
        [DEFAULT, "strict", "relaxed"],
        key="researcher_models_build_policy",
        format_func=lambda p: "strict unless relaxed below" if p == DEFAULT else p,
        help="strict: the task's dev/test rules, the model at chance; relaxed: what you choose when strict "
        "cannot be met (docs/round_builder.md, Build policies)",
    )
    chance = cols[2].selectbox(
        "Model at chance",
        [DEFAULT, "yes", "no"],
        key="researcher_models_build_chance",
        format_func=lambda c: "the policy's" if c == DEFAULT else c,
        help="Equal (gold, predicted) cells in dev and test; strict: yes, relaxed: no. No is relaxed.",
    )
    votes = cols[3].selectbox(
        "Votes for dev/test",
        [DEFAULT, *range(task_votes - 1, 0, -1)],
        key="researcher_models_build_votes",
        format_func=lambda v: f"the task's ({task_votes} of {responses})" if v == DEFAULT else f"{v} of {responses}",
        help="Votes for gold a dev/test example needs; fewer than the task's is relaxed.",
    )
    shares: list[float | str] = [DEFAULT, *GUARD_SHARES]
    share = cols[4].selectbox(
        "Class-balance guard",
        shares,
        key="researcher_models_build_share",
        format_func=lambda v: "the policy's" if v == DEFAULT else f"dev+test up to {v:g} of a class",
        help="Dev+test take at most this share of each class's eligible examples, so train keeps the rest "
        "(relaxed: 0.5; strict: none). 1.0 holds nothing back.",
    )
    return build_settings(int(seed), policy, chance, votes, share)


def build_section(client: Api, task: Task) -> None:
    st.subheader("Build a round")
    round_ = choose_round(client, task, "researcher_models_build_round", statuses=("closed", "built"))
    if round_ is None:
        st.caption("Close a round on the Tasks and rounds page to build it.")
        return
    settings = policy_controls(task)
    label = "Rebuild" if round_["status"] == "built" else "Build"
    outcome_key = f"researcher_models_build_refused_{round_['id']}"
    outcome = st.session_state.get(outcome_key)
    if outcome and outcome["settings"] != settings:
        # The options shown were computed for other settings (a seed, a policy changed since).
        st.session_state.pop(outcome_key)
    left, right = st.columns(2)
    if left.button(f"{label} round {round_['number']}", type="primary", key="researcher_models_build"):
        _build(client, round_, settings, outcome_key)
    if right.button("Preview every policy", key="researcher_models_build_preview"):
        _preview(client, round_, settings, outcome_key)
    outcome = st.session_state.get(outcome_key)
    if outcome:
        relaxation_choice(client, round_, outcome, outcome_key)


def _preview(client: Api, round_: Round, settings: dict[str, Any], outcome_key: str) -> None:
    """What ``settings`` and every other policy would give the round; nothing is recorded."""
    try:
        with st.spinner("Computing the splits of every policy ..."):
            previewed = client.preview_build(round_["id"], **settings)
    except ApiError as error:
        state.show_api_error(error)
        return
    requested = {**previewed["requested"], "name": "as set above"}
    st.session_state[outcome_key] = {
        "settings": settings,
        "message": None,
        "short": [],
        "previews": [requested, *previewed.get("relaxations", [])],
    }


def _build(client: Api, round_: Round, settings: dict[str, Any], outcome_key: str) -> None:
    """Build with ``settings``; a refusal with options is kept so the page can offer them."""
    try:
        with st.spinner("Aggregating labels, computing agreement and building the splits ..."):
            built = client.build_round(round_["id"], **settings)
    except ApiError as error:
        if error.details.get("relaxations") is not None:
            st.session_state[outcome_key] = {
                "settings": settings,
                "message": error.message,
                "short": error.details.get("short") or [],
                "previews": error.details["relaxations"],
            }
        else:
            state.show_api_error(error)
        return
    st.session_state.pop(outcome_key, None)
    report = built.get("report") or {}
    total = report.get("counts", {}).get("total", {})
    policy = (report.get("splits", {}).get("policy") or {}).get("name", "strict")
    state.flash(
        "success",
        f"Built round {built.get('round', round_['number'])} (build {built.get('build_id')}): "
        f"train {total.get('train', 0):,}, dev {total.get('dev', 0):,}, test {total.get('test', 0):,}; "
        f"{policy} policy.",
    )
    st.rerun()


def relaxation_choice(client: Api, round_: Round, outcome: dict[str, Any], outcome_key: str) -> None:
    """A refusal (what is short) or a preview: the options that build with their counts, those
    that do not and why, and a build with the one the researcher picks."""
    if outcome["message"]:
        render.alert("error", outcome["message"])
    if outcome["short"]:
        st.caption("Short of examples for dev and test:")
        st.dataframe(pd.DataFrame(outcome["short"]), hide_index=True)
    previews = outcome["previews"]
    refused = refused_frame(previews)
    if not refused.empty:
        with st.expander(f"Options that do not build ({len(refused)})"):
            st.dataframe(refused, hide_index=True, key="researcher_models_build_refused_options")
    options = [r for r in previews if r.get("feasible")]
    if not options:
        st.caption(NOTHING_BUILDS)
        return
    st.caption(
        "Options that build this round (docs/round_builder.md, Build policies), each with its dev, test and "
        "train counts and each class's train/dev/test. A relaxed build's report says it is relaxed and shows "
        "the model's measured numbers on dev and test."
    )
    st.dataframe(options_frame(options), hide_index=True, key="researcher_models_build_options")
    names = [r["name"] for r in options]
    chosen = st.radio("Build with", names, key="researcher_models_build_relaxation")
    if chosen not in names:  # a choice from an earlier outcome
        chosen = names[0]
    option_settings = next(r["settings"] for r in options if r["name"] == chosen)
    if st.button(f"Build round {round_['number']}: {chosen}", key="researcher_models_build_relaxed"):
        _build(client, round_, {"seed": outcome["settings"]["seed"], **option_settings}, outcome_key)


# --- train -------------------------------------------------------------------------------


def train_section(client: Api, task: Task, rounds: list[Round], busy: bool) -> None:
    st.subheader("Train the next model")
    built = [r["number"] for r in rounds if r["status"] == "built"]
    if not built:
        st.caption("Build a round first: the model trains on every built round's train split.")
        return
    st.caption(
        f"From the base checkpoint, on the train split of round(s) {', '.join(map(str, built))}, with round "
        f"{max(built)}'s dev split for early stopping (DynaSent §5.3: retrain from scratch every round)."
    )
    # The task YAML's training defaults (docs/training.md, "The task's defaults"), preselected.
    task_training = task["definition"].get("training", {})
    # Enter in a number field must not start a training run: only the button submits.
    with st.form("researcher_models_train_form", enter_to_submit=False):
        cols = st.columns(4)
        epochs = cols[0].number_input(
            "Epochs",
            1,
            1000,
            int(task_training.get("epochs", 3)),
            key="researcher_train_epochs",
            help="Default: the task's `training.epochs`",
        )
        batch_size = cols[1].number_input("Batch size", 1, 4096, 32, key="researcher_train_batch")
        learning_rate = cols[2].number_input(
            "Learning rate",
            1e-7,
            1.0,
            float(task_training.get("learning_rate", 2e-5)),
            step=1e-6,
            format="%.1e",
            key="researcher_train_lr",
            help="Default: the task's `training.learning_rate`",
        )
        max_length = cols[3].number_input("Max tokens", 8, 8192, 128, key="researcher_train_max_length")
        cols = st.columns(4)
        serves = cols[0].number_input(
            "For round",
            1,
            10_000,
            max(r["number"] for r in rounds) + 1,
            key="researcher_train_round",
            help="The round this model will serve",
        )
        seed = cols[1].number_input("Seed", 0, 2**31 - 1, 0, key="researcher_train_seed")
        patience = cols[2].number_input(
            "Patience",
            0,
            1000,
            2,
            key="researcher_train_patience",
            help="Epochs without a better dev macro-F1 before stopping; 0: never",
        )
        task_weights = task_training.get("class_weights", "none")
        weights = cols[3].selectbox(
            "Class weights",
            ["none", "balanced"],
            index=1 if task_weights == "balanced" else 0,
            key="researcher_train_weights",
            help="Default: the task's `training.class_weights`",
        )
        allow_unknown = st.checkbox(
            "Train even if the backbone's tokenizer cannot read the task's script",
            False,
            key="researcher_train_allow_unknown",
            help="Training is refused when more than DYNALOOP_MAX_UNKNOWN_TOKEN_SHARE of the text's tokens "
            "become the unknown token (docs/training.md, 'Tokenizer coverage'); a multilingual "
            "checkpoint is the better fix, or the linear kind, which reads any script offline.",
        )
        kind = st.selectbox(
            "Model kind",
            ["encoder", "linear"],
            index=0,
            key="researcher_train_kind",
            help="encoder: fine-tune the backbone. linear: a class-balanced character and word n-gram model "
            "(`dynaloop round train --kind linear`) that reads any script and trains in seconds on a CPU: for "
            "a script the backbone's tokenizer cannot read, or without a GPU. Epochs, batch size, learning rate "
            "and max tokens do not apply to it.",
        )
        submitted = st.form_submit_button("Train", type="primary", disabled=busy, key="researcher_train_submit")
    if submitted:
        start(
            client,
            task["name"],
            "train",
            {
                "epochs": int(epochs),
                "batch_size": int(batch_size),
                "learning_rate": float(learning_rate),
                "max_length": int(max_length),
                "round": int(serves),
                "seed": int(seed),
                "patience": int(patience),
                "class_weights": weights,
                "allow_unknown_tokens": bool(allow_unknown),
                "kind": kind,
            },
        )


# --- registry: evaluate, promote ---------------------------------------------------------------


def model_status_text(model: Model) -> str:
    """The chosen model's status in one line (Markdown, user text escaped)."""
    status = model["status"]
    text = f"Status: **{status}**"
    if status == "promoted" and model.get("endpoint"):
        text += f", served by the model server at {render.escape_markdown(str(model['endpoint']))}"
    elif status == "trained":
        text += ", not evaluated yet"
    elif status == "evaluated":
        text += ", not promoted"
    return text


def registry_section(client: Api, task: Task, rounds: list[Round], busy: bool) -> None:
    st.subheader("Model registry")
    try:
        models = client.models(task["name"])
    except ApiError as error:
        state.show_api_error(error)
        return
    if not models:
        st.caption("No model is registered for this task yet.")
        return
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "id": m["id"],
                    "name": m["name"],
                    "status": m["status"],
                    "for round": m.get("trained_for_round"),
                    "best dev macro-F1": m.get("best_dev_macro_f1"),
                    **{f"F1 {name}": value for name, value in (m.get("macro_f1") or {}).items()},
                    "endpoint": m.get("endpoint"),
                    "attempts scored": m.get("attempts"),
                    "created": m.get("created_at"),
                }
                for m in models
            ]
        ),
        hide_index=True,
        key="researcher_models_registry",
    )
    by_id = {m["id"]: m for m in models}
    if st.session_state.get(NEXT_MODEL_KEY) in by_id:
        st.session_state[MODEL_KEY] = st.session_state.pop(NEXT_MODEL_KEY)
    # The options are labelled with what never changes (the name). The browser keeps the label
    # of the chosen option as the widget's value, so a label with the status in it went on
    # saying "(evaluated)" after the model was promoted; the status is shown below instead,
    # read afresh on every run.
    chosen = st.selectbox(
        "Model",
        list(by_id),
        index=len(by_id) - 1,
        key=MODEL_KEY,
        format_func=lambda i: by_id[i]["name"],
    )
    model = by_id[chosen]
    st.markdown(model_status_text(model))
    left, right = st.columns(2)
    with left:
        st.caption("Evaluate on every built round's dev and test split (DynaSent Table 5b).")
        if st.button("Evaluate", key="researcher_models_evaluate", disabled=busy):
            start(client, task["name"], "evaluate", {"model_id": model["id"]})
    with right:
        try:
            servers = {s["name"]: s for s in client.model_servers() if s["has_admin_token"]}
        except ApiError as error:
            state.show_api_error(error)
            return
        in_loop = [name for r in rounds for name in (r.get("model_servers") or []) if name in servers]
        names = sorted(servers, key=lambda name: (name not in in_loop, name))

        def where(name: str) -> str:
            if name == FOLLOWERS:
                return "every model-server replica that follows the task"
            return f"{name} ({servers[name]['url']})"

        with st.form("researcher_models_promote_form", enter_to_submit=False):
            server = st.selectbox(
                "Promote it to (the replicas that follow the task load it themselves; a registered model "
                "server is swapped in place)",
                [*names, FOLLOWERS],  # a server in a round's loop first, as before; else the followers
                key="researcher_promote_server",
                format_func=where,
            )
            force = st.checkbox(
                "Promote even though it was never evaluated",
                key="researcher_promote_force",
                disabled=model["status"] != "trained",
            )
            submitted = st.form_submit_button("Promote", disabled=busy, key="researcher_promote_submit")
        if submitted:
            st.session_state.get(WORSE_KEY, {}).pop(task["name"], None)
            params: dict[str, Any] = {"model_id": model["id"], "force": bool(force)}
            if server:
                params["server"] = server
            start(client, task["name"], "promote", params)
    confirm_worse(client, task["name"], by_id, busy)


def confirm_worse(client: Api, task: str, models: dict[int, Model], busy: bool) -> None:
    """A promotion the API refused as worse: its reason, the scores, and the researcher's choice."""
    refused = st.session_state.get(WORSE_KEY, {}).get(task)
    if not refused:
        return
    render.alert("warning", refused["message"])
    scores = refused["details"].get("scores") or []
    if scores:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "model": s.get("model"),
                        "set": s.get("set"),
                        "macro-F1": s.get("macro_f1"),
                        "chance": s.get("chance_macro_f1"),
                    }
                    for s in scores
                ]
            ),
            hide_index=True,
            key="researcher_models_worse_scores",
        )
    model = models.get(refused["params"].get("model_id"))
    name = model["name"] if model is not None else f"model {refused['params'].get('model_id')}"
    left, right = st.columns(2)
    if left.button(f"Promote anyway ({name})", key="researcher_promote_anyway", disabled=busy):
        st.session_state[WORSE_KEY].pop(task, None)
        start(client, task, "promote", {**refused["params"], "confirm_worse": True})
    if right.button("Do not promote", key="researcher_promote_not"):
        st.session_state[WORSE_KEY].pop(task, None)
        state.flash("info", render.escape_markdown(f"{name} was not promoted."))
        st.rerun()


# --- downloads ---------------------------------------------------------------------------


def downloads_section(client: Api, task: Task) -> None:
    st.subheader("Dataset and report")
    round_ = choose_round(client, task, "researcher_models_download_round", statuses=("built",))
    if round_ is None:
        st.caption("Build a round to download its splits and report.")
        return
    name, number = task["name"], round_["number"]
    cols = st.columns(3)
    split = cols[0].selectbox("Split", SPLITS, key="researcher_download_split")
    file_format = cols[1].selectbox("Format", list(FORMATS), key="researcher_download_format")
    what = cols[2].radio(
        "What",
        ["dataset", "report"],
        key="researcher_download_what",
        format_func=lambda w: "the split" if w == "dataset" else "the report (Markdown)",
    )
    if st.button("Fetch", key="researcher_download_fetch"):
        try:
            if what == "dataset":
                data = client.download_dataset(name, number, split=split, format=file_format)
                st.session_state[DOWNLOAD_KEY] = {
                    "name": f"{name}-r{number}-{split}.{file_format}",
                    "data": data,
                    "mime": FORMATS[file_format],
                }
            else:
                text = client.report(name, number, format="markdown")
                st.session_state[DOWNLOAD_KEY] = {
                    "name": f"{name}-r{number}-report.md",
                    "data": str(text).encode("utf-8"),
                    "mime": "text/markdown",
                }
        except ApiError as error:
            state.show_api_error(error)
            st.session_state.pop(DOWNLOAD_KEY, None)
    ready = st.session_state.get(DOWNLOAD_KEY)
    if ready:
        st.download_button(
            f"Download {ready['name']} ({len(ready['data']):,} bytes)",
            data=ready["data"],
            file_name=ready["name"],
            mime=ready["mime"],
            key="researcher_download_button",
            icon=":material/download:",
        )


def main() -> None:
    client = state.require_role("researcher")
    st.title("Models and datasets")
    state.show_flash()
    task = choose_task(client, "researcher_models_task")
    if task is None:
        st.info("No task yet: create one on the Tasks and rounds page.")
        return
    try:
        rounds = client.rounds(task["name"])
    except ApiError as error:
        state.show_api_error(error)
        return
    job_progress(client, task["name"])
    failed_jobs(client, task["name"])
    busy = st.session_state.get(ACTIVE_JOB_KEY, {}).get(task["name"]) is not None
    build_section(client, task)
    train_section(client, task, rounds, busy)
    registry_section(client, task, rounds, busy)
    jobs_table(client, task["name"])
    downloads_section(client, task)


main()
