"""The Streamlit script of the web app (served by ``frontend/server.py``: ``dynaloop ui``).

The browser's session cookie (set by the server's ``/login`` page, frontend/web.py) signs the
user in, once the API has said whose token it holds (``state.restore_session``). Signed in,
the navigation holds the pages of the user's roles: writers get Write, validators Validate,
researchers the researcher pages, and admins everything (an admin passes every role check in
the API too). Signed out, every page says so and links to ``/login?next=<that page>``. The
API's address comes from ``$DYNALOOP_API_URL`` (default http://127.0.0.1:8000).
"""

from __future__ import annotations

import sys
from pathlib import Path

_FRONTEND = Path(__file__).resolve().parent
if str(_FRONTEND.parent) not in sys.path:  # `streamlit run frontend/app.py` from a source checkout
    sys.path.insert(0, str(_FRONTEND.parent))

import streamlit as st  # noqa: E402
from streamlit.navigation.page import StreamlitPage  # noqa: E402

from frontend import render, state  # noqa: E402
from frontend.page_gate import PAGE_ROLES  # noqa: E402

# The page scripts. Not `pages/`: Streamlit takes a `pages/` folder next to the entry point for
# an old-style multipage app and runs a process's first session in that mode, where a deep link
# is answered with a "Page not found" dialog and a url path equal to a file name runs that file
# without this script (its login check and navigation).
PAGES = _FRONTEND / "app_pages"
# (file, title, url path, roles that see it); researcher pages appear once their files
# exist. Titles and roles come from frontend/page_gate.py PAGE_ROLES, which the server's page gate
# uses to answer a deep link to a page of another role.
_FILES: dict[str, list[tuple[str, str]]] = {
    "Write": [("writer.py", "write")],
    "Validate": [("validator.py", "validate")],
    "Research": [
        ("researcher_rounds.py", "rounds"),
        ("researcher_dashboard.py", "dashboard"),
        ("researcher_models.py", "models"),
        ("researcher_crowd.py", "crowd"),
    ],
}
ROLE_PAGES: dict[str, list[tuple[str, str, str, tuple[str, ...]]]] = {
    section: [(file, PAGE_ROLES[url].title, url, PAGE_ROLES[url].roles) for file, url in files]
    for section, files in _FILES.items()
}


def _no_pages() -> None:
    st.title("dynaloop")
    st.info(
        f"Your roles ({', '.join(state.roles()) or 'none'}) have no pages here. Ask an admin for the writer, "
        "validator or researcher role; REST clients use the API directly."
    )


def navigation_pages() -> dict[str, list[StreamlitPage]]:
    """The pages the signed-in user may open, by section."""
    sections: dict[str, list[StreamlitPage]] = {}
    for section, pages in ROLE_PAGES.items():
        for filename, title, url_path, roles in pages:
            path = PAGES / filename
            if state.has_role(*roles) and path.is_file():
                sections.setdefault(section, []).append(st.Page(path, title=title, url_path=url_path))
    return sections


def _start(first: StreamlitPage) -> StreamlitPage:
    """The app's start address ``/``: moves on to the user's first page. Streamlit serves its
    navigation's default page at ``/`` only and answers that page's own url path with a "Page
    not found" dialog, so no page of a role is the default: each keeps its own address, and a
    deep link to ``/write`` (or ``/login?next=/write``) opens it as it is."""

    def start() -> None:
        st.switch_page(first)

    return st.Page(start, title="Start", url_path="start", default=True, visibility="hidden")


def logout_form() -> str:
    """The Log out button: a form that POSTs to the server's ``/logout`` (frontend/web.py),
    which revokes the login's token and clears the session cookie."""
    action = render.escape(f"{state.base_path()}/logout")
    return (
        f'<form method="post" action="{action}" style="margin: 0.5rem 0;">'
        '<button type="submit" style="padding: 0.3rem 0.8rem; border-radius: 0.5rem; border: 1px solid #ccc; '
        'background: white; cursor: pointer;">Log out</button></form>'
    )


def sidebar() -> None:
    user = state.current_user()
    name = (user.get("display_name") or user.get("username")) if user else None
    with st.sidebar:
        st.text(f"Signed in as {name or '?'}")
        st.caption(", ".join(state.roles()))
        render.show_html(logout_form())


def _signed_out(url_path: str) -> StreamlitPage:
    def signed_out() -> None:
        st.title("dynaloop")
        problem = st.session_state.get(state.SESSION_PROBLEM_KEY)
        if problem:
            render.alert("warning", f"You are signed out: {problem}")
        else:
            st.info("You are signed out.")
        link = render.escape(state.login_link(url_path))
        render.show_html(f'<p style="font-size: 1.1rem;"><a href="{link}" target="_self">Log in</a></p>')

    return st.Page(signed_out, title="Log in", url_path=url_path or "signed-out", default=not url_path)


def main() -> None:
    st.set_page_config(page_title="dynaloop", layout="wide")
    state.restore_session()
    if not state.is_logged_in():
        # Every page's address answers, so a deep link keeps its place through the login.
        page = st.navigation([_signed_out(""), *(_signed_out(url) for url in PAGE_ROLES)], position="hidden")
        page.run()
        return
    sections = navigation_pages()
    if sections:
        first = next(iter(sections.values()))[0]
        sections = {"": [_start(first)], **sections}
    else:
        sections = {"": [st.Page(_no_pages, title="Welcome", url_path="welcome")]}
    page = st.navigation(sections)
    sidebar()
    page.run()


main()
