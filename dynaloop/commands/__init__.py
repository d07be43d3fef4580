"""The `dynaloop` command groups, one module each; ``dynaloop.cli`` assembles them.

A command parses its options, calls one use case or domain function, and prints the result;
the work itself lives in ``services``, ``rounds.build`` and ``rounds.models``. Shared helpers
(settings, the database options, error output) are in :mod:`dynaloop.commands.common`.
"""
