"""Request and response bodies of the REST API: one module per entity, named as its routes
module in ``dynaloop/api/routes/`` (``errors`` holds the shape every error has)."""
