"""The Kafka adapter: the only package that imports kafka-python.

:class:`KafkaSource` is the consumer-group member of ``evaluator run`` (with its
dead letters and forwarded events); :class:`KafkaSink` produces simulated or
replayed events onto the input topics.
"""

from evaluator.adapters.kafka.sink import KafkaSink
from evaluator.adapters.kafka.source import KafkaSource
from evaluator.adapters.topics import dead_letter_record

__all__ = ["KafkaSink", "KafkaSource", "dead_letter_record"]
