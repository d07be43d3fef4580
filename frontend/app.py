"""The Streamlit entry point: ``dynaloop ui``, or ``streamlit run frontend/app.py``.

Signed out, the only page is the login page. Signed in, the navigation holds the pages of
the user's roles: writers get Write, validators Validate, researchers the researcher pages,
and admins everything (an admin passes every role check in the API too). The API's address
comes from ``$DYNALOOP_API_URL`` (default http://127.0.0.1:8000).
"""

from __future__ import annotations

import sys
from pathlib import Path

_FRONTEND = Path(__file__).resolve().parent
if str(_FRONTEND.parent) not in sys.path:  # `streamlit run frontend/app.py` from a source checkout
    sys.path.insert(0, str(_FRONTEND.parent))

import streamlit as st  # noqa: E402
from streamlit.navigation.page import StreamlitPage  # noqa: E402

from frontend import state  # noqa: E402

PAGES = _FRONTEND / "pages"
# (file, title, url path, roles that see it); researcher pages appear once their files
# exist. Every url path differs from its file's name on purpose: Streamlit treats a `pages/`
# folder next to the entry point as an old-style multipage app, and a url path equal to a
# file name there would make it run that file directly, skipping this script (its login
# check and navigation) on a fresh server or in AppTest.
ROLE_PAGES: dict[str, list[tuple[str, str, str, tuple[str, ...]]]] = {
    "Write": [("writer.py", "Write", "write", ("writer",))],
    "Validate": [("validator.py", "Validate", "validate", ("validator",))],
    "Research": [
        ("researcher_rounds.py", "Tasks and rounds", "rounds", ("researcher",)),
        ("researcher_dashboard.py", "Dashboard", "dashboard", ("researcher",)),
        ("researcher_models.py", "Models and datasets", "models", ("researcher",)),
    ],
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


def sidebar() -> None:
    user = state.current_user()
    name = (user.get("display_name") or user.get("username")) if user else None
    with st.sidebar:
        st.text(f"Signed in as {name or '?'}")
        st.caption(", ".join(state.roles()))
        if st.button("Log out", key="app_logout"):
            state.logout()
            st.rerun()


def main() -> None:
    st.set_page_config(page_title="dynaloop", layout="wide")
    if not state.is_logged_in():
        page = st.navigation([st.Page(PAGES / "login.py", title="Log in", url_path="sign-in")], position="hidden")
        page.run()
        return
    sections = navigation_pages() or {"": [st.Page(_no_pages, title="Welcome", url_path="welcome")]}
    page = st.navigation(sections)
    sidebar()
    page.run()


main()
