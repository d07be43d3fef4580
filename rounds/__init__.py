"""Everything after collection: the round builder (`rounds.build`: a closed round into a
dataset) and the model lifecycle (`rounds.models`: retraining, evaluation, the registry,
promotion, the jobs that run them). See docs/architecture.md."""
