"""recsys-evaluator: a streaming online evaluator for recommender systems."""

__version__ = "0.1.0"
