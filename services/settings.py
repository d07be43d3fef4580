"""One settings object for the backend, read from the environment (prefix ``DYNALOOP_``)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from model_server.directory.tokenizer_coverage import DEFAULT_MAX_UNKNOWN_TOKEN_SHARE
from services.forwarded import IPNetwork, parse_trusted_proxies
from services.origins import parse_origins
from services.structured_input import DEFAULT_MAX_INPUT_DEPTH, DEFAULT_MAX_YAML_NODES

PLACEHOLDER_SECRETS = {"", "change-me", "changeme", "secret", "dev-secret-change-me"}
DEFAULT_SECRET = "dev-secret-change-me"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DYNALOOP_", env_file=".env", extra="ignore")

    environment: Literal["development", "test", "production"] = Field(
        "development",
        description="`production` refuses placeholder secrets and SQLite-in-memory URLs.",
    )
    data_dir: Path = Field(Path(".dynaloop"), description="Folder for the default SQLite file and model directories.")
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db. Default: a SQLite file in data_dir.",
    )
    secret_key: str = Field(
        DEFAULT_SECRET,
        description="Key for pseudonymous worker ids in exports. Set a long random value outside development.",
    )
    model_timeout_s: float = Field(10.0, gt=0, description="Timeout of one call to a model server.")
    model_retries: int = Field(2, ge=0, le=5, description="Extra tries on a model server connection error or 5xx.")
    retry_after_s: int = Field(
        5, ge=1, description="Seconds a client is told to wait (Retry-After) when the model is down."
    )
    max_request_bytes: int = Field(5 * 1024 * 1024, ge=1024, description="Larger request bodies are refused with 413.")
    max_prompt_import_rows: int = Field(200_000, ge=1, description="Most prompts in one import.")
    data_root: Path | None = Field(
        None,
        description="The one server folder whose files a job's data mix may name, by a path relative to it "
        "(`file: sst/train.csv`). Unset: jobs read only uploaded datasets (POST "
        "/tasks/{task}/datasets/uploads). It must not contain data_dir (the database, every task's uploads).",
    )
    max_unknown_token_share: float = Field(
        DEFAULT_MAX_UNKNOWN_TOKEN_SHARE,
        ge=0,
        le=1,
        description="Task creation, evaluation and the model server warn, and `round train` refuses (without "
        "--allow-unknown-tokens / `allow_unknown_tokens`), when more than this share of the task's tokens "
        "are the backbone tokenizer's unknown token (e.g. [UNK] for MiniLM on Ge'ez script).",
    )
    max_upload_rows: int = Field(1_000_000, ge=1, description="Most rows in one uploaded dataset.")
    sqlite_busy_timeout_ms: int = Field(10_000, ge=0)

    worker_threads: int = Field(
        128,
        ge=8,
        le=2048,
        description="Threads that run the API's request handlers. Keep it above "
        "max_concurrent_requests: on SQLite a request may wait for the write lock in one of them, and the "
        "request holding the lock needs a free one to finish.",
    )
    freeze_gc_at_startup: bool = Field(
        False,
        description="Move everything the API process holds once it has started (modules, the app, its "
        "routes and schemas) out of reach of Python's cyclic garbage collector (gc.freeze). Each full "
        "collection otherwise walked ~370,000 objects and stopped every request for up to 0.2 s under "
        'load (docs/benchmarks.md, "Load and faults"). `dynaloop api` turns it on; off for apps '
        "built in-process (tests), which would keep every frozen app alive.",
    )
    max_concurrent_requests: int = Field(
        100,
        ge=1,
        description="Requests in flight at once per API process; more get 503 `overloaded` (JSON) at once.",
    )
    rate_limit_per_token: str = Field(
        "120/minute",
        description="Most writer and validator requests per API token (a `limits` string, e.g. "
        "`120/minute;2000/hour`); `none` turns the limit off.",
    )
    rate_limit_per_ip: str = Field(
        "1200/minute",
        description="Most writer and validator requests per client address (a lab behind one "
        "NAT shares it); `none` turns the limit off.",
    )
    web_app_key: str | None = Field(
        None,
        description="A secret shared with the web app (the same DYNALOOP_WEB_APP_KEY in its environment): "
        "requests that carry it count against the browser's address the web app names, not the web "
        "app's own address, in the per-address rate limit and login throttle. Unset: every web-app "
        "user shares the web app's address.",
    )
    trusted_proxies: str = Field(
        "",
        description="The proxies (nginx, a load balancer) whose X-Forwarded-For or Forwarded header names "
        "the client's address: IP addresses and CIDR networks, comma-separated (e.g. `172.28.0.0/16`). "
        "Only a request whose socket peer is one of them is read that way (the rightmost hop that is "
        "not itself a trusted proxy is the client); from anyone else the headers are ignored. Empty "
        "(the default): the socket peer is the client. The rate limits and the login throttle count "
        "this address (services/forwarded.py).",
    )
    rate_limit_storage: str = Field(
        "memory://",
        description="Where the counters live: `memory://` (one API process) or "
        "`redis://host:6379` so that every API replica shares them.",
    )

    # Login throttle and password pool (dynaloop/api/ratelimit.py LoginThrottle; counters in rate_limit_storage).
    login_max_failures_per_user: int = Field(
        5, ge=1, description="Failed logins for one username (within login_failure_window_s) before it is locked."
    )
    login_max_failures_per_address: int = Field(
        100,
        ge=1,
        description="Failed logins from one client address (any usernames) before it is locked; a lab "
        "behind one NAT shares it.",
    )
    login_failure_window_s: int = Field(
        3600, ge=1, description="Failed logins are counted for this long from the first one."
    )
    login_lockout_s: int = Field(
        30, ge=1, description="The first lock-out; each further failed login doubles it, up to login_lockout_max_s."
    )
    login_lockout_max_s: int = Field(900, ge=1, description="The longest lock-out.")
    login_password_workers: int = Field(
        default_factory=lambda: min(8, max(1, (os.cpu_count() or 1) // 4)),
        ge=1,
        le=64,
        description="Threads that check login passwords (PBKDF2, ~50 ms of CPU each; default: a quarter "
        "of the CPU cores, 1 to 8); logins beyond them wait their turn, leaving the CPU and the handler "
        "threads to other requests (bench/login_flood.py).",
    )
    login_max_waiting: int = Field(
        32, ge=1, description="Logins that may wait for a password thread; more get 429 at once."
    )
    # --- input bounds (docs/api.md "Input limits"; services/structured_input.py, services/text.py)
    max_input_depth: int = Field(
        DEFAULT_MAX_INPUT_DEPTH,
        ge=2,
        le=200,
        description="Deepest nesting of arrays/objects (JSON bodies, NDJSON prompt lines) or of "
        "mappings/lists (task YAML); deeper input is refused with 422.",
    )
    max_yaml_nodes: int = Field(
        DEFAULT_MAX_YAML_NODES, ge=100, description="Most values (scalars, lists, mappings) in one task YAML."
    )

    # --- bulkheads: model calls cannot stall the rest (docs/reliability.md "Model calls") ---
    model_deadline_s: float = Field(
        5.0,
        gt=0,
        le=120,
        description="Most seconds one attempt's (or inspect's) model call may take, the wait for a "
        "model-call slot and every retry included; then the writer gets 503 `model_unavailable`.",
    )
    model_max_concurrency: int = Field(
        16, ge=1, le=1024, description="Model calls at once per API process (the model-call slots)."
    )
    model_queue_wait_s: float = Field(
        0.5,
        ge=0,
        le=30,
        description="How long a model call waits for a free slot before the writer gets 503 `model_busy`.",
    )
    max_concurrent_model_requests: int = Field(
        16,
        ge=1,
        description="Attempt and inspect requests in flight at once per API process; more get 503 "
        "`model_busy` at once, before any database work. Below max_concurrent_requests, so other "
        "requests always find room; at most model_max_concurrency, so that while the model hangs "
        "the requests let in wait in its slots instead of going through the database again and again.",
    )
    model_requests_per_writer: int = Field(
        2,
        ge=1,
        le=100,
        description="Attempt and inspect requests one writer (one API token) may have in flight at "
        "once; more get 429 `too_many_in_flight`. One attempt per assignment in any case.",
    )
    # --- uploads decode within bounds (docs/security.md "Uploaded files"; rounds/models/bounded_tables.py)
    max_upload_decoded_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="Most bytes one uploaded or imported file may decode to (strings in UTF-8, "
        "dictionaries expanded, the sizes a Parquet footer declares); more is refused with 413 before "
        "it is decoded.",
    )
    max_upload_cell_chars: int = Field(
        20_000,
        ge=100,
        description="Most characters in one cell of an uploaded or imported file; the text column's "
        "limit is the task's max_chars where that is lower. A longer cell is refused with 422.",
    )

    # --- crowd identity: new worker accounts from study links (docs/security.md "Crowd identity")
    study_new_workers_per_link_per_hour: int = Field(
        60,
        ge=1,
        description="Most new worker accounts one study link creates in an hour (counted in the database, "
        "so every API process agrees); more first opens get 429 `too_many_new_workers` and write nothing.",
    )
    study_new_workers_per_address_per_hour: int = Field(
        5,
        ge=1,
        description="Most new worker accounts created from one client address in an hour, over every link "
        "(only a keyed hash of the address is stored); a lab behind one NAT shares it.",
    )

    # --- crowd platforms' APIs (services/platforms/; docs/crowdsourcing.md "Paying and approving through the APIs")
    # Only the operator sets these (the environment): no request and no researcher chooses where
    # the token goes. The token is a SecretStr: never logged, never stored in the database.
    prolific_api_token: SecretStr | None = Field(
        None, description="Prolific's API token (Settings > API tokens on Prolific); unset: no Prolific calls."
    )
    prolific_api_url: str = Field(
        "https://api.prolific.com",
        description="Prolific's API. HTTPS; plain HTTP only to this machine (127.0.0.1, ::1, localhost) for tests.",
    )
    platform_timeout_s: float = Field(
        20.0, gt=0, le=300, description="Most seconds one call to a platform's API may take, the answer included."
    )
    platform_max_response_bytes: int = Field(
        1024 * 1024, ge=1024, le=64 * 1024 * 1024, description="Larger answers from a platform's API are refused."
    )
    mturk_sandbox: bool = Field(
        True,
        description="Call MTurk's sandbox (no money moves). Set false to pay real workers on mturk.com.",
    )
    mturk_access_key_id: str | None = Field(
        None, description="AWS key for MTurk; unset: boto3's own chain (AWS_ACCESS_KEY_ID, ~/.aws, a role)."
    )
    mturk_secret_access_key: SecretStr | None = Field(None, description="Its secret; set both or neither.")
    mturk_submit_origins: str = Field(
        "https://www.mturk.com,https://workersandbox.mturk.com",
        description="Where an MTurk study session may post its assignment back (the `turkSubmitTo` "
        'that MTurk appends to a link, and the action of the "Submit the HIT" form): origins, comma- '
        "or space-separated, https only (plain http only on localhost/127.0.0.1, for tests). Give the "
        "web app the same value (it checks the form's action again). A link opened with another "
        "turkSubmitTo is refused with 422 and nothing written.",
    )

    # --- bulkheads: one client's burst (issue 26, item 10; docs/reliability.md "One client's burst")
    requests_per_token: int = Field(
        8,
        ge=1,
        le=1000,
        description="Requests of any kind one API token may have in flight at once per API process; "
        "more get 429 `too_many_in_flight` at once, on the event loop, before the token is looked up "
        "or any database work is done. A person's browser or script needs a few; a burst of hundreds "
        "from one token takes this many places and no more.",
    )
    burst_penalty_s: float = Field(
        1.0,
        ge=0,
        le=10,
        description="A token refused for too many requests in flight (requests_per_token or "
        "model_requests_per_writer, 429 `too_many_in_flight`) has every request refused for this "
        "long after its last refusal, and each refusal is held back this long before it is sent "
        "(taking no place): a flooding script that resends at once gets one answer per connection "
        "per penalty and nothing in, instead of thousands of answers a second that keep the event "
        "loop from everyone else. A client that waits for its answers never meets it. 0 turns it off.",
    )

    # --- metrics and logs (issue 31; docs/deploy.md "Logs and metrics")
    log_format: Literal["text", "json"] = Field(
        "text",
        description="`json`: the API writes one JSON object per log line (request_id, and for each request "
        "one access line with method, route, status and duration_ms) and turns off uvicorn's access log; "
        "`text`: Python's and uvicorn's plain lines, for a researcher's terminal. The compose stack uses json.",
    )
    metrics_token: SecretStr | None = Field(
        None,
        description="The bearer token GET /metrics (Prometheus) asks for; at least 16 characters. Unset: "
        "/metrics answers 404. Give Prometheus the same value (docker/prometheus/prometheus.yml).",
    )

    @model_validator(mode="after")
    def _metrics_token_long_enough(self) -> Settings:
        if self.metrics_token is not None and len(self.metrics_token.get_secret_value().strip()) < 16:
            raise ValueError(
                "DYNALOOP_METRICS_TOKEN is shorter than 16 characters; set it to a long random value "
                "(`python -c 'import secrets; print(secrets.token_urlsafe(32))'`) or leave it unset"
            )
        return self

    @model_validator(mode="after")
    def _model_requests_leave_room(self) -> Settings:
        if self.max_concurrent_model_requests >= self.max_concurrent_requests:
            raise ValueError(
                "DYNALOOP_MAX_CONCURRENT_MODEL_REQUESTS must be below DYNALOOP_MAX_CONCURRENT_REQUESTS, "
                "or attempts waiting for the model could take every place (docs/reliability.md)"
            )
        return self

    @model_validator(mode="after")
    def _no_placeholder_secret_in_production(self) -> Settings:
        # Only a developer's own machine may run with the placeholder; a test or production
        # deployment must set a real secret (it keys the pseudonymous worker ids in exports).
        if self.environment != "development" and (
            self.secret_key.strip().lower() in PLACEHOLDER_SECRETS or len(self.secret_key) < 16
        ):
            raise ValueError(
                "DYNALOOP_SECRET_KEY is a placeholder or shorter than 16 characters; set it to a "
                "long random value (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
            )
        return self

    @model_validator(mode="after")
    def _web_app_key_long_enough(self) -> Settings:
        # Whoever knows it chooses the address their requests count against (a fresh rate-limit
        # budget, a fresh login-failure count per request), so it must not be guessable.
        if self.web_app_key is not None and len(self.web_app_key.strip()) < 16:
            raise ValueError(
                "DYNALOOP_WEB_APP_KEY is shorter than 16 characters; set it to a long random value "
                "(`python -c 'import secrets; print(secrets.token_urlsafe(32))'`) or leave it unset"
            )
        return self

    @model_validator(mode="after")
    def _platform_api_settings(self) -> Settings:
        from urllib.parse import urlsplit

        url = urlsplit(self.prolific_api_url)
        local = url.hostname in {"127.0.0.1", "::1", "localhost"}
        if url.scheme != "https" and not (url.scheme == "http" and local):
            raise ValueError(
                "DYNALOOP_PROLIFIC_API_URL must be an https:// address (plain http only to this machine, for tests)"
            )
        if url.query or url.fragment or url.username or url.password:
            raise ValueError("DYNALOOP_PROLIFIC_API_URL must be a bare address, without credentials, query or fragment")
        if (self.mturk_access_key_id is None) != (self.mturk_secret_access_key is None):
            raise ValueError("set both DYNALOOP_MTURK_ACCESS_KEY_ID and DYNALOOP_MTURK_SECRET_ACCESS_KEY, or neither")
        return self

    @model_validator(mode="after")
    def _trusted_proxies_parse(self) -> Settings:
        parse_trusted_proxies(self.trusted_proxies)  # a ValueError names the entry that is wrong
        return self

    @model_validator(mode="after")
    def _mturk_submit_origins_parse(self) -> Settings:
        if not parse_origins(self.mturk_submit_origins, "DYNALOOP_MTURK_SUBMIT_ORIGINS"):
            raise ValueError("DYNALOOP_MTURK_SUBMIT_ORIGINS is empty; name MTurk's hosts (the default)")
        return self

    @property
    def mturk_submit_origin_list(self) -> tuple[str, ...]:
        return parse_origins(self.mturk_submit_origins, "DYNALOOP_MTURK_SUBMIT_ORIGINS")

    @property
    def trusted_proxy_networks(self) -> tuple[IPNetwork, ...]:
        return parse_trusted_proxies(self.trusted_proxies)

    @model_validator(mode="after")
    def _data_root_apart_from_data_dir(self) -> Settings:
        # Every researcher may train on any file under the data root; the data folder holds the
        # database, every task's uploads and the job logs, which they must not read that way.
        if self.data_root is not None:
            root, data_dir = self.data_root.resolve(), self.data_dir.resolve()
            if data_dir.is_relative_to(root):
                raise ValueError(
                    f"DYNALOOP_DATA_ROOT ({root}) contains DYNALOOP_DATA_DIR ({data_dir}); give the data root "
                    "a folder of its own that holds only the files researchers may train on"
                )
        return self

    @property
    def placeholder_secret_warning(self) -> str | None:
        """What to say at start-up while the pseudonym key is a placeholder (development only:
        elsewhere such settings are refused). With a known key anyone recomputes every worker's
        pseudonym in an export from their user id."""
        if self.secret_key.strip().lower() not in PLACEHOLDER_SECRETS and len(self.secret_key) >= 16:
            return None
        return (
            "DYNALOOP_SECRET_KEY is a placeholder: the worker pseudonyms in exports can be recomputed "
            "from user ids by anyone who knows it. Fine on a developer's machine; before real workers "
            "take part, set it to a long random value (`python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'`) and keep it with the backups (docs/security.md)"
        )

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'dynaloop.db').resolve()}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
