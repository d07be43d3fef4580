"""The model lifecycle: data mixes, retraining from the base checkpoint, inference,
evaluation (DynaSent Table 5b), the model registry and promotion, Round-1 harvesting, and the
jobs that run them outside the API.

It uses ``services`` and the round builder's built splits, and writes model directories in the
format of ``model_server.directory`` (which the model server loads); see docs/architecture.md.
"""
