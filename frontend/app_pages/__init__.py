"""Page scripts of the web app (run through ``st.navigation`` in ``frontend/app.py``)."""
