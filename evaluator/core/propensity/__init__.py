"""Position propensities: the models applied, and their estimators (randomized, harvesting, EM)."""
