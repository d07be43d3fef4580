"""The model server: a separate process hosting the round's classifier behind /predict.

It depends on nothing else in the project: the backend talks to it over HTTP only.
"""
