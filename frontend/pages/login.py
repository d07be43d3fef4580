"""Log in with a username and password (``POST /auth/login``) or with an API token."""

from __future__ import annotations

import streamlit as st

from frontend import render, state
from frontend.client import ApiError


def _password_login() -> None:
    with st.form("login_form"):
        username = st.text_input("Username", key="login_username", autocomplete="username")
        password = st.text_input("Password", type="password", key="login_password", autocomplete="current-password")
        submitted = st.form_submit_button("Log in", type="primary", key="login_submit")
    if not submitted:
        return
    if not username.strip() or not password:
        st.warning("Enter your username and password.")
        return
    client = state.get_client()
    try:
        result = client.login(username.strip(), password)
    except ApiError as error:
        state.show_api_error(error)
        return
    state.login(result["token"], result["user"])
    st.rerun()


def _token_login() -> None:
    with st.expander("Use an API token instead"):
        st.caption("Tokens come from `dynaloop user token NAME` or from an admin; they start with `dl_`.")
        with st.form("token_form"):
            token = st.text_input("API token", type="password", key="login_api_token")
            submitted = st.form_submit_button("Use this token", key="login_token_submit")
        if not submitted:
            return
        token = token.strip()
        if not token:
            st.warning("Paste your API token.")
            return
        client = state.get_client()
        client.token = token
        try:
            user = client.me()
        except ApiError as error:
            client.token = None
            state.show_api_error(error)
            return
        state.login(token, user)
        st.rerun()


st.title("dynaloop")
st.markdown("Adversarial data collection: write sentences that fool the model, or label what others wrote.")
_password_login()
_token_login()
render.show_html(f'<div style="font-size: 0.8rem; color: #666;">API: {render.escape(state.api_url())}</div>')
