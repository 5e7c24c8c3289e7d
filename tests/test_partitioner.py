"""The producers' partitioners, against Kafka's own test vectors and kafka-python."""

from __future__ import annotations

import random
import zlib

import pytest
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from evaluator.partitioner import PartitionOf, murmur2

# org.apache.kafka.common.utils.UtilsTest#testMurmur2
JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "want"), JAVA_VECTORS.items())
def test_murmur2_matches_the_java_client(key: bytes, want: int) -> None:
    assert murmur2(key) == want


def test_murmur2_partitions_match_kafka_python() -> None:
    rng = random.Random(3)
    partition = PartitionOf("murmur2", 7)
    users = [f"user-{rng.randrange(10**9)}" + "x" * rng.randrange(4) for _ in range(2_000)]
    want = [(kafka_python_murmur2(u.encode()) & 0x7FFFFFFF) % 7 for u in users]
    assert partition(users) == want
    assert partition(users) == want  # from the cache


def test_crc32_is_librdkafkas_consistent_partitioner() -> None:
    users = [f"u{i}" for i in range(500)]
    assert PartitionOf("crc32", 5)(users) == [zlib.crc32(u.encode()) % 5 for u in users]


def test_trust_checks_nothing() -> None:
    assert not PartitionOf("trust", 3).checks
