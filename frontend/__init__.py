"""The Streamlit front end: writer, validator and researcher pages.

It talks to the dynaloop REST API over HTTP only (see ``frontend.client``) and imports
nothing from the backend packages, so it can run on another machine than the API.
"""
