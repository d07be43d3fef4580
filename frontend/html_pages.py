"""The web app's own HTML pages: login, messages, and what a crowdworker meets at the start and
the end of a study (a preview, the finish page, the completion). Every piece of user text on a
page is escaped; every page is unframeable (frontend/framing.py) unless its route says otherwise.
"""

from __future__ import annotations

import html
from urllib.parse import urlsplit

from starlette.responses import HTMLResponse, RedirectResponse, Response

from frontend.client import Completion, StudySession, StudyStart
from frontend.forms import MAX_PASSWORD, MAX_USERNAME
from frontend.framing import DEFAULT_MTURK_SUBMIT_ORIGINS, deny_framing
from frontend.sessions import MAX_NEXT, MAX_TOKEN

__all__ = ["completion_page", "finish_page", "login_page", "message_page", "study_preview_page"]

MAX_COMPLETION_FIELDS = 20
# Where a completion may send the worker: Prolific's completion page, and MTurk's external
# submit on its two hosts (or the admin's $DYNALOOP_MTURK_SUBMIT_ORIGINS, the API's setting of
# the same name). Anything else the API says is refused, not followed.
PROLIFIC_COMPLETION_PREFIX = "https://app.prolific.com/"


_STYLE = """
body { font-family: "Source Sans Pro", system-ui, sans-serif; margin: 0; background: #fff; color: #31333f; }
main { max-width: 26rem; margin: 4rem auto; padding: 0 1rem; }
h1 { font-size: 2.2rem; margin-bottom: .25rem; }
label { display: block; margin: .9rem 0 .3rem; font-size: .9rem; }
input { width: 100%; box-sizing: border-box; padding: .55rem; font-size: 1rem; border: 1px solid #ccc;
        border-radius: .4rem; background: #f0f2f6; }
button { margin-top: 1rem; padding: .5rem 1rem; font-size: 1rem; border-radius: .4rem; border: 1px solid #ff4b4b;
         background: #ff4b4b; color: #fff; cursor: pointer; }
details { margin-top: 2rem; } summary { cursor: pointer; }
details button { background: #fff; color: #31333f; border-color: #ccc; }
.error { background: #ffe5e5; color: #7d1a1a; padding: .7rem; border-radius: .4rem; margin: 1rem 0; }
.notice { background: #e8f4ff; color: #0c4a7a; padding: .7rem; border-radius: .4rem; margin: 1rem 0; }
.muted { font-size: .8rem; color: #666; margin-top: 2rem; }
"""


DEFAULT_CSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'"


def _page(title: str, body: str, status: int = 200, csp: str = DEFAULT_CSP) -> HTMLResponse:
    markup = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body><main>{body}</main></body></html>"
    )
    response = HTMLResponse(markup, status_code=status)
    response.headers["Cache-Control"] = "no-store"
    response.headers["Content-Security-Policy"] = csp
    response.headers["Referrer-Policy"] = "same-origin"
    deny_framing(response)
    return response


def login_page(
    base: str,
    next_path: str,
    api_url: str,
    *,
    error: str | None = None,
    notice: str | None = None,
    username: str = "",
    status: int = 200,
) -> HTMLResponse:
    e = html.escape
    action = e(f"{base}/login")
    hidden_next = f'<input type="hidden" name="next" value="{e(next_path)}">'
    body = (
        "<h1>dynaloop</h1>"
        "<p>Adversarial data collection: write sentences that fool the model, or label what others wrote.</p>"
        + (f'<div class="notice" role="status">{e(notice)}</div>' if notice else "")
        + (f'<div class="error" role="alert">{e(error)}</div>' if error else "")
        + f'<form method="post" action="{action}">{hidden_next}'
        '<input type="hidden" name="kind" value="password">'
        '<label for="username">Username</label>'
        f'<input id="username" name="username" aria-label="Username" autocomplete="username" required '
        f'maxlength="{MAX_USERNAME}" value="{e(username)}" autofocus>'
        '<label for="password">Password</label>'
        f'<input id="password" name="password" type="password" aria-label="Password" '
        f'autocomplete="current-password" required maxlength="{MAX_PASSWORD}">'
        '<button type="submit">Log in</button></form>'
        "<details><summary>Use an API token instead</summary>"
        "<p>Tokens come from <code>dynaloop user token NAME</code> or from an admin; they start with "
        "<code>dl_</code>. Logging out forgets a pasted token in this browser but does not revoke it.</p>"
        f'<form method="post" action="{action}">{hidden_next}'
        '<input type="hidden" name="kind" value="token">'
        '<label for="api_token">API token</label>'
        f'<input id="api_token" name="token" type="password" aria-label="API token" required '
        f'maxlength="{MAX_TOKEN}" autocomplete="off">'
        '<button type="submit">Use this token</button></form></details>'
        f'<p class="muted">API: {e(api_url)}</p>'
    )
    return _page("Log in - dynaloop", body, status)


def message_page(title: str, message: str, link: str, link_text: str, status: int) -> HTMLResponse:
    e = html.escape
    body = (
        f'<h1>{e(title)}</h1><div class="error" role="alert">{e(message)}</div>'
        f'<p><a href="{e(link)}">{e(link_text)}</a></p>'
    )
    return _page(f"{title} - dynaloop", body, status)


def _plain_url(value: object, prefixes: tuple[str, ...]) -> str | None:
    """``value`` if it is an address under one of ``prefixes`` with nothing odd in it, else None.
    Only https, except under a plain-http prefix (an admin's loopback origin, for tests)."""
    if not isinstance(value, str) or len(value) > MAX_NEXT or not value.startswith(prefixes):
        return None
    if any(ord(c) < 33 or ord(c) == 127 or c in "\\<>\"'" for c in value):
        return None
    parts = urlsplit(value)
    http_allowed = value.startswith(tuple(prefix for prefix in prefixes if prefix.startswith("http://")))
    if parts.scheme != "https" and not (parts.scheme == "http" and http_allowed):
        return None
    if parts.username is not None or parts.password is not None:
        return None
    return value


def study_preview_page(preview: StudyStart) -> HTMLResponse:
    """MTurk's preview (the worker has not accepted the HIT): the task, read-only."""
    e = html.escape
    task = preview.get("task") or {}
    link = preview.get("link") or {}
    role = str(link.get("role") or "")
    unit = "examples to write" if role == "writer" else "batches of examples to label"
    body = (
        f"<h1>{e(str(task.get('title') or task.get('name') or 'A dynaloop study'))}</h1>"
        f"<p>{e(str(task.get('description') or ''))}</p>"
        f"<p>Your part: <strong>{e(role or 'worker')}</strong>, {e(str(link.get('quota') or '?'))} {unit}.</p>"
        '<div class="notice" role="status">This is a preview. Accept the HIT to start.</div>'
    )
    return _page("Preview - dynaloop", body)


def _code_block(code: str) -> str:
    e = html.escape
    return (
        '<p style="font-size: 2rem; font-family: monospace; letter-spacing: .1rem; user-select: all;" '
        f'aria-label="Completion code">{e(code)}</p>'
        "<p>Copy this code (select it and copy) into the study's page on your platform.</p>"
    )


def completion_page(
    completion: Completion, base: str, mturk_submit_origins: tuple[str, ...] = DEFAULT_MTURK_SUBMIT_ORIGINS
) -> Response:
    """The end of a study session on its platform: a redirect to Prolific, a form that posts back
    to MTurk (on one of ``mturk_submit_origins``), or the code to copy; an address outside the
    platforms' own is refused."""
    e = html.escape
    status = completion.get("status")
    code = completion.get("code")
    screened_out = status == "screened_out"
    # A stopped session is not a completed one: without the link's partial code there is no code
    # at all, and the worker returns the submission on the platform.
    stopped = status == "stopped"
    title = (
        "This study is not for you this time"
        if screened_out
        else "Your session has ended"
        if stopped and not code
        else "Thank you"
    )
    intro = (
        "<p>You did not qualify for this study. Thank you for your time.</p>"
        if screened_out
        else "<p>You stopped before the study's quota: this is not a completed submission. Please return "
        "it on your platform (on Prolific: Return submission); do not submit it as completed.</p>"
        if stopped and not code
        else "<p>Your study session has ended. Thank you!</p>"
    )
    message = completion.get("message")
    if isinstance(message, str) and message:
        intro += f'<div class="notice" role="status">{e(message[:500])}</div>'

    redirect_url = completion.get("redirect_url")
    if redirect_url is not None:
        target = _plain_url(redirect_url, (PROLIFIC_COMPLETION_PREFIX,))
        if target is not None:
            response = RedirectResponse(target, status_code=303)
            response.headers["Cache-Control"] = "no-store"
            response.headers["Referrer-Policy"] = "no-referrer"
            return response
        # Not Prolific's address: the code (if any) is still the worker's, the address is not followed.
    form = completion.get("form")
    if form is not None:
        action = _plain_url(form.get("action"), tuple(f"{origin}/" for origin in mturk_submit_origins))
        fields = form.get("fields")
        if action is None or not isinstance(fields, dict) or len(fields) > MAX_COMPLETION_FIELDS:
            return message_page(
                "Completion refused",
                "The completion form points somewhere other than Mechanical Turk; it was not shown. "
                "Tell the study's researcher.",
                f"{base}/",
                "Go to the app",
                502,
            )
        hidden = "".join(
            f'<input type="hidden" name="{e(str(name))}" value="{e(str(value))}">' for name, value in fields.items()
        )
        body = (
            f"<h1>{e(title)}</h1>{intro}"
            "<p>Submit the HIT to Mechanical Turk to get paid.</p>"
            f'<form method="post" action="{e(action)}">{hidden}<button type="submit">Submit the HIT</button></form>'
            + (_code_block(code) if code else "")
        )
        origin = "{0.scheme}://{0.netloc}".format(urlsplit(action))
        csp = f"default-src 'none'; style-src 'unsafe-inline'; form-action {origin}"
        return _page("Submit the HIT - dynaloop", body, csp=csp)
    if code:
        return _page(f"{title} - dynaloop", f"<h1>{e(title)}</h1>{intro}{_code_block(code)}")
    if screened_out:
        return _page(
            f"{title} - dynaloop", f"<h1>{e(title)}</h1>{intro}<p>You may return the study on your platform.</p>"
        )
    if stopped:
        return _page(f"{title} - dynaloop", f"<h1>{e(title)}</h1>{intro}")
    return _page(
        f"{title} - dynaloop",
        f"<h1>{e(title)}</h1>{intro}<p>This study has no completion code; tell the study's researcher.</p>",
    )


def finish_page(base: str, session: StudySession) -> HTMLResponse:
    """Confirm before ending a study session: the quota met, or stopping early (which is not a
    completion: no completion code), or, for a validator, the round out of work for them."""
    e = html.escape
    done, quota = int(session.get("units_done") or 0), int(session.get("quota") or 0)
    validator = session.get("role") == "validator"
    unit = "labels" if validator else "examples"
    met = session.get("status") != "active" or done >= quota
    reason = "quota" if met else "stop"
    progress = f"{done} of {quota} {unit} for this study"
    warning = (
        ""
        if met
        else '<div class="error" role="alert">You have not reached the quota yet. Stopping now ends your study '
        "session without the completion code (you cannot go on with it afterwards): you will be asked to "
        "return the submission, unless the study pays for partial work.</div>"
    )
    session_field = f'<input type="hidden" name="session_id" value="{int(session["id"])}">'
    action = e(f"{base}/study/finish")
    out_of_work = (
        f'<form method="post" action="{action}">{session_field}'
        '<input type="hidden" name="reason" value="out_of_work">'
        "<p>The Validate page has no more examples for you? The study ends with what you labelled.</p>"
        '<button type="submit">No more examples to label: finish</button></form>'
        if validator and not met
        else ""
    )
    body = (
        "<h1>Finish the study</h1>"
        f'<p role="status">{e(progress)}.</p>{warning}'
        f'<form method="post" action="{action}">{session_field}'
        f'<input type="hidden" name="reason" value="{reason}">'
        f'<button type="submit">{"Finish and get your completion code" if met else "Stop now"}</button></form>'
        f"{out_of_work}"
        f'<p><a href="{e(f"{base}/" if session.get("role") == "writer" else f"{base}/validate")}">'
        "Back to the task</a></p>"
    )
    # The answer to the form may redirect to Prolific's completion page (form-action covers it).
    csp = f"default-src 'none'; style-src 'unsafe-inline'; form-action 'self' {PROLIFIC_COMPLETION_PREFIX.rstrip('/')}"
    return _page("Finish the study - dynaloop", body, csp=csp)
