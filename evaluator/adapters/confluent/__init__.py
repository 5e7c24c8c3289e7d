"""The confluent-kafka (librdkafka) adapter: the only package that imports
confluent_kafka. :class:`ConfluentSource` is the consumer-group member of
``evaluator run`` with ``kafka.client = "confluent"`` (the optional
``confluent`` extra)."""

from evaluator.adapters.confluent.source import ConfluentSource

__all__ = ["ConfluentSource"]
