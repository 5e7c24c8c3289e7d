"""Instructions per event of the engine in process, beside replay: a count, not a time.

    make services && eval "$(python3 scripts/services.py env)"
    .venv/bin/python bench/bench_instructions.py [--requests 30000] [--partitions 4]
        [--poll-ms 16000] [--store redis|memory] [--warm-book] [--regression on|final|off]
        [--twice] [--no-replay] [--no-engine] [--checkpoint-interval 1s]
        [--no-interactions] [--uuid-ids] [--set SECTION.KEY=VALUE ...]

It needs valgrind (Debian's ``valgrind`` package). The CPU time of
``bench_engine.py`` moves by 20% and more from minute to minute on the shared VMs
(BENCHMARKS.md, sessions 35-41), so a change of 5-10% takes many paired runs to see.
This runs the same work under valgrind's cachegrind, which counts the instructions a
process executes: the same count for the same code and inputs, whatever else the
machine does (the hash seed is fixed). Each figure is the count of a child that does
the work less the count of a child that does all but the work (imports, the events
made, the store and the tasks set up), so only the work remains:

- the engine: ``bench_engine.run_once`` over the same polls as ``bench_engine.py``
  (``Tasks.apply`` per poll, checkpoints in line, the inputs drained);
- replay: ``evaluate_files`` on the same events written as JSON Lines, its work in
  one process (it forks a second from 50,000 requests or 4 MB: a forked child's
  count would start from its parent's).

Reported: instructions per event of each, and the engine's as a multiple of
replay's, the whole-file batch path over the same join and scores. The Redis
server's work is not counted (another process); the client's is. valgrind runs
Python about 20x slower: a run of 30,000 requests takes a few minutes. ``--twice``
counts the engine twice to show the count repeats (within 0.5% at 30,000 requests,
session 41; ASLR is off for the children, since objects hashed by address would
otherwise iterate in another order from run to run).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from _common import machine

HERE = Path(__file__).resolve().parent
MODES = ("engine-setup", "engine", "replay-setup", "replay")


def make_events(requests: int, uuid_ids: bool = False) -> tuple[list[bytes], list[bytes]]:
    """The events of ``bench_engine.py`` (and ``bench_run.py``); ``uuid_ids``: their
    request ids as a prefix and a UUID."""
    from _common import synthetic_events

    return synthetic_events(
        requests,
        spacing_ms=20,
        per_request=(0, 1, 1, 2),
        types=("click", "add_to_cart", "purchase"),
        uuid_ids=uuid_ids,
    )


def count(mode: str, args: argparse.Namespace, folder: str) -> int:
    """Instructions of a child running ``mode`` (every process it forks included)."""
    out = os.path.join(folder, f"{mode}.%p")
    child = (
        [
            sys.executable,
            str(HERE / "bench_instructions.py"),
            "--child",
            mode,
            "--requests",
            str(args.requests),
            "--partitions",
            str(args.partitions),
            "--poll-ms",
            str(args.poll_ms),
            "--store",
            args.store,
            "--regression",
            args.regression,
            "--prefix",
            args.prefix,
            "--checkpoint-interval",
            args.checkpoint_interval,
        ]
        + [f"--set={item}" for item in args.set]
        + (["--warm-book"] if args.warm_book else [])
        + ([] if args.interactions else ["--no-interactions"])
        + (["--uuid-ids"] if args.uuid_ids else [])
    )
    # one BLAS thread: threads that spin while they wait would count as work
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    command = [
        "setarch",
        "-R",
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        f"--cachegrind-out-file={out}",
    ]
    done = subprocess.run(command + child, env=env, capture_output=True, text=True, check=False)
    drop(args)  # outside the count: the next child starts from the same empty prefix
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
    total = 0
    for path in glob.glob(os.path.join(folder, f"{mode}.*")):
        with open(path) as lines:
            total += sum(int(line.split()[1]) for line in lines if line.startswith("summary:"))
        os.remove(path)
    return total


def drop(args: argparse.Namespace) -> None:
    """Delete the children's keys in Redis (one prefix for all: the same strings hash
    the same in every child)."""
    if args.store == "redis":
        import bench_engine as be
        import redis

        be._drop(redis.Redis.from_url(os.environ["REDIS_URL"]), args.prefix)


def child(args: argparse.Namespace) -> None:
    """The work of one mode (see the module docstring), run under valgrind."""
    import bench_engine as be
    from _common import T0

    from evaluator.app import replay
    from evaluator.config import load_settings
    from evaluator.engine.runtime import tune_gc

    tune_gc()  # as ``evaluator run`` and bench_engine.py
    # numpy imports numpy.ma at the first np.unique (~78 M instructions once): in both
    # children, so the count is the work's alone
    import numpy.ma  # noqa: F401

    imps, ints = make_events(args.requests, args.uuid_ids)
    if not args.interactions:
        ints = []
    overrides = {
        "join": {"attribution_window": "5m"},
        "redis": {"key_prefix": args.prefix},
        "regression": be.REGRESSION[args.regression],
        "engine": {"checkpoint_interval": args.checkpoint_interval},
    }
    for item in args.set:  # section.key=value
        name, value = item.split("=", 1)
        section, key = name.split(".", 1)
        try:  # a number, a list, ... else the text itself ("5m")
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        overrides.setdefault(section, {})[key] = parsed
    settings = load_settings(environ={}, overrides=overrides)
    if args.child.startswith("engine"):
        feed = be.split(be.polls(imps, ints, args.poll_ms), args.partitions)
        store, _ = be._store(args.store, settings, args.prefix, args.partitions)
        work = args.child == "engine"
        be.run_once(
            store,
            settings,
            feed if work else [],
            args.partitions,
            drain=work,
            catalog=[f"p{n}" for n in range(50_000)] if args.warm_book else (),
        )
        return
    with tempfile.TemporaryDirectory() as folder:
        files = []
        for name, payloads in (("impressions", imps), ("interactions", ints)):
            path = Path(folder) / f"{name}.jsonl"
            path.write_bytes(b"\n".join(payloads) + b"\n")
            files.append(path)
        if args.child == "replay":
            # in one process: a forked child's count would include its parent's so far
            replay.PARALLEL_MIN_BYTES = replay.PARALLEL_MIN_REQUESTS = 2**62
            replay.evaluate_files(*files, settings, progress=False, now_ms=T0 + 10**12)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=30_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--poll-ms", type=int, default=16_000)
    parser.add_argument("--store", choices=["redis", "memory"], default="redis")
    parser.add_argument("--regression", choices=["on", "no-maturity", "final", "off"], default="on")
    parser.add_argument("--warm-book", action="store_true")
    parser.add_argument(
        "--uuid-ids",
        action="store_true",
        help="request ids as most producers send them: a prefix and a UUID (else r<n>)",
    )
    parser.add_argument(
        "--checkpoint-interval",
        default="1s",
        help="engine.checkpoint_interval; the synthetic clock moves 100 ms a poll (as in "
        "bench_engine.py), so the default checkpoints every 10 polls and 0 after each",
    )
    parser.add_argument("--twice", action="store_true", help="count the engine twice")
    parser.add_argument("--no-replay", dest="replay", action="store_false")
    parser.add_argument("--no-engine", dest="engine", action="store_false")
    parser.add_argument(
        "--no-interactions",
        dest="interactions",
        action="store_false",
        help="impressions only (per event of the full run: what the interactions cost)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a setting for the run, e.g. windows.user_buckets=16 (repeatable)",
    )
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    args.prefix = f"bench-instr-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as folder:
        modes = [m for m in MODES if (args.replay or "replay" not in m)]
        modes = [m for m in modes if (args.engine or "engine" not in m)]
        counted = {mode: count(mode, args, folder) for mode in modes}
        again = count("engine", args, folder) if args.twice and args.engine else None
    imps, ints = make_events(args.requests, args.uuid_ids)
    events = len(imps) + len(ints)
    print(f"machine: {machine()}")
    print(
        f"{events:,} events ({len(imps):,} impressions of 20 items), polls of "
        f"{args.poll_ms // 1000} s of event time over {args.partitions} partition(s), "
        f"{args.store} store, regression {args.regression}"
        f"{', a warm codebook' if args.warm_book else ''}"
        f"{'' if args.interactions else ', impressions only (per event of the full run)'}"
        "; instructions counted by cachegrind"
    )
    engine = None
    if args.engine:
        engine = (counted["engine"] - counted["engine-setup"]) / events
        print(f"  the engine in process: {engine:,.0f} instructions per event")
    if again is not None:
        print(f"  the engine, counted again: {(again - counted['engine-setup']) / events:,.0f}")
    if args.replay:
        replay = (counted["replay"] - counted["replay-setup"]) / events
        print(f"  evaluator replay of the same events: {replay:,.0f} instructions per event")
        if engine is not None:
            print(f"  the engine at {engine / replay:.2f}x replay")


if __name__ == "__main__":
    main()
