"""The producers' partitioners, against Kafka's own test vectors and kafka-python."""

from __future__ import annotations

import random
import zlib

import pytest
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from evaluator.engine.partitioner import PartitionOf, murmur2, murmur2_partitions

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


def test_vectorised_murmur2_equals_kafka_pythons_at_every_length() -> None:
    """Every tail length and block count, bytes above 0x7F included (UTF-8 keys)."""
    rng = random.Random(5)
    keys = [bytes(rng.randrange(256) for _ in range(n)) for n in range(41) for _ in range(30)]
    keys += [s.encode() for s in ("é", "ユーザー42", "u\x00v")]
    want = [(kafka_python_murmur2(k) & 0x7FFFFFFF) % 11 for k in keys]
    assert murmur2_partitions(keys, 11) == want


def test_partitions_of_a_few_new_users_among_cached_ones() -> None:
    """A call with fewer new users than the vectorised path takes: scalar, merged in
    order with the cached ones."""
    partition = PartitionOf("murmur2", 7)
    old = [f"old-{i}" for i in range(500)]
    partition(old)
    mixed = [*old[:10], "new-a", *old[10:20], "new-b", "new-a"]
    assert partition(mixed) == [(kafka_python_murmur2(u.encode()) & 0x7FFFFFFF) % 7 for u in mixed]


def test_crc32_is_librdkafkas_consistent_partitioner() -> None:
    users = [f"u{i}" for i in range(500)]
    assert PartitionOf("crc32", 5)(users) == [zlib.crc32(u.encode()) % 5 for u in users]


def test_trust_checks_nothing() -> None:
    assert not PartitionOf("trust", 3).checks
