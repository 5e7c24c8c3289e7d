"""The commands that generate traffic: ``evaluator simulate`` (events with a known
ground truth, to files or Kafka) and ``evaluator demo`` (the simulator through the live
engine, on an embedded store by default)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evaluator.app.cli_common import (
    Parser,
    UsageError,
    add_service_flags,
    config_option,
    port_free,
    positive,
    service_overrides,
)
from evaluator.app.logs import setup_logging
from evaluator.config import Settings, load_settings

if TYPE_CHECKING:
    from evaluator.core.simulator import SimulationConfig


def _cmd_simulate(args: argparse.Namespace) -> int:
    import threading

    from evaluator.app.run import install_signal_handlers
    from evaluator.app.simulate import FileSink, simulate, write_truth

    settings = load_settings(args.config)
    setup_logging()
    config = _simulation_config(settings, args)
    if args.out_dir is None and not args.kafka:
        raise UsageError("name a destination: --out-dir DIR or --kafka")
    positive(requests=args.requests, rate=args.rate if args.rate else None)
    stop = threading.Event()
    install_signal_handlers(stop)
    if args.kafka:
        from evaluator.adapters.kafka import KafkaSink

        sink: Any = KafkaSink(settings.kafka)
    else:
        sink = FileSink(args.out_dir)
    progress = False if args.no_progress else None
    simulator = simulate(
        config,
        sink,
        args.requests,
        rate=args.rate,
        stop=stop,
        progress=progress,
        live=args.kafka and args.start_ms is None,
    )
    truth_path = args.truth or (args.out_dir / "truth.json" if args.out_dir else None)
    write_truth(simulator, truth_path)
    if truth_path is not None:
        print(f"ground truth: {truth_path}", file=sys.stderr)
    return 0


def _simulation_config(settings: Settings, args: argparse.Namespace) -> SimulationConfig:
    """``simulate``'s flags as a SimulationConfig (a bad value: one line naming its flag).
    With --kafka and no --start-ms, event time starts now (live traffic)."""
    import time

    from evaluator.app.simulate import config_from_args

    options = {
        "eta": args.eta,
        "mode": args.mode,
        "users": args.users,
        "items": args.items,
        "randomized_fraction": args.randomized_fraction,
        "randomization": args.randomization,
        "late_fraction": args.late_fraction,
        "duplicate_fraction": args.duplicate_fraction,
        "malformed_fraction": args.malformed_fraction,
        "out_of_order_fraction": args.out_of_order_fraction,
        "interleave": args.interleave or None,
        "requests_per_second": args.requests_per_second,
    }
    seasons = {
        "daily_amplitude": args.daily_amplitude,
        "weekly_dip": args.weekly_dip,
        "relevance_amplitude": args.relevance_amplitude,
    }
    start_ms = args.start_ms
    if args.kafka and start_ms is None:
        start_ms = time.time_ns() // 1_000_000
    try:
        return config_from_args(
            settings,
            args.seed,
            args.variant,
            options,
            start_ms,
            seasons=seasons,
            regression=args.inject_regression,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def add_simulate(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "simulate",
        parents=[config_option()],
        help="generate traffic with a known ground truth (to files or Kafka)",
        description="Users, items and variants with latent relevance; clicks from a "
        "position-based model; prints the expected nDCG and true propensities at the end.",
    )
    p.add_argument("--out-dir", type=Path, help="write impressions.jsonl, interactions.jsonl")
    p.add_argument("--kafka", action="store_true", help="produce to the configured Kafka topics")
    p.add_argument("--requests", type=int, help="requests to generate (default: until stopped)")
    p.add_argument("--rate", type=float, default=0.0, help="events/s cap (default: unlimited)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", action="append", help="NAME:NOISE (repeatable); lower ranks better")
    p.add_argument("--eta", type=float, help="examination propensity k**-eta (default 1.0)")
    p.add_argument("--mode", choices=["ecommerce", "video"])
    p.add_argument("--users", type=int)
    p.add_argument("--items", type=int)
    p.add_argument("--randomized-fraction", type=float)
    p.add_argument("--randomization", choices=["topn", "swap"])
    p.add_argument("--late-fraction", type=float)
    p.add_argument("--out-of-order-fraction", type=float)
    p.add_argument("--duplicate-fraction", type=float)
    p.add_argument("--malformed-fraction", type=float)
    p.add_argument(
        "--interleave",
        action="store_true",
        help="show every request the team-draft interleaving of the first two variants "
        "(variant 'interleaved'; the truth gives the preference)",
    )
    _add_season_flags(p)
    p.add_argument(
        "--start-ms",
        type=int,
        help="first event time (default: 2026-01-01; with --kafka, now, and each event is "
        "produced once the wall clock reaches its time, as live traffic)",
    )
    p.add_argument("--truth", type=Path, help="ground-truth JSON path (default: stdout/out-dir)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_cmd_simulate)


def _add_season_flags(p: argparse.ArgumentParser) -> None:
    """Seasonality and an injected regression (evaluator.core.seasons); all off by default."""
    p.add_argument(
        "--requests-per-second",
        type=float,
        metavar="R",
        help="requests per second of event time (default 100; a weekday's mean with the cycles)",
    )
    p.add_argument(
        "--daily-amplitude",
        type=float,
        metavar="A",
        help="request rate x (1 + A cos(2π (t - 20:00 UTC) / 1 day)), A in [0, 1) (default 0)",
    )
    p.add_argument(
        "--weekly-dip",
        type=float,
        metavar="SHARE",
        help="request rate lower by SHARE on Saturdays and Sundays (UTC), in [0, 1) (default 0)",
    )
    p.add_argument(
        "--relevance-amplitude",
        type=float,
        metavar="A",
        help="click probabilities x (1 + A cos(2π (t - 20:00 UTC) / 1 day)), at most 1; "
        "A in [0, 1] (default 0)",
    )
    p.add_argument(
        "--inject-regression",
        metavar="VARIANT:DROP:AFTER",
        help="from AFTER (after the start: 6h; or an instant) on, VARIANT's click "
        "probabilities x (1 - DROP), e.g. treatment:0.03:6h; the truth gives the nDCG "
        "before and after",
    )


def _cmd_demo(args: argparse.Namespace) -> int:
    import threading

    from evaluator.app.demo import DEMO_PARTITIONS, run_demo
    from evaluator.app.run import install_signal_handlers
    from evaluator.engine.ports import StateStore

    positive(requests=args.requests, rate=args.rate, speed=args.speed)
    settings = _demo_settings(args)
    setup_logging()
    stop = threading.Event()
    install_signal_handlers(stop)
    print(
        f"evaluator demo: dashboard on http://{settings.http.host}:{settings.http.port}/ "
        "(Ctrl-C stops)",
        file=sys.stderr,
    )
    if args.kafka:
        simulator = _demo_through_kafka(settings, args, stop)
    else:
        store: StateStore | None = None
        if args.redis:
            store = _wait_for_redis(settings, DEMO_PARTITIONS, stop)
            if store is None:
                return 0
        simulator = run_demo(
            settings,
            seed=args.seed,
            requests_per_s=args.rate,
            speed=args.speed,
            requests=args.requests,
            store=store,
            stop=stop,
            interleave=args.interleave,
        )
    json.dump(simulator.truth.as_dict(), sys.stderr, indent=2)
    sys.stderr.write("\n")
    return 0


def _demo_settings(args: argparse.Namespace) -> Settings:
    """The demo's settings (its defaults under the file, environment and flags), on a
    port that is free now."""
    import msgspec

    from evaluator.app.demo import demo_tree
    from evaluator.config import load_tree

    overrides = service_overrides(args)
    settings = load_settings(None, overrides=demo_tree(load_tree(args.config, overrides=overrides)))
    port = port_free(settings.http.host, settings.http.port)
    if port != settings.http.port:
        http = msgspec.structs.replace(settings.http, port=port)
        settings = msgspec.structs.replace(settings, http=http)
    return settings


def _demo_through_kafka(settings: Settings, args: argparse.Namespace, stop: Any) -> Any:
    """``demo --kafka``: the simulator produces to the topics on a thread while
    ``evaluator run``'s loop consumes them; returns the simulator (its ground truth)."""
    import threading

    from evaluator.adapters.kafka import KafkaSink
    from evaluator.app.demo import build_memory_store, sim_config
    from evaluator.app.run import build_store, run
    from evaluator.app.simulate import simulate
    from evaluator.core.simulator import Simulator
    from evaluator.engine.ports import StateStore

    config = sim_config(settings, args.seed, args.rate, args.speed, args.interleave)
    holder: list[Simulator] = []

    def produce() -> None:
        while not stop.is_set():  # the broker may come up after the demo
            try:
                sink = KafkaSink(settings.kafka)
                break
            except ConnectionError as exc:
                logging.getLogger("evaluator.demo").warning("%s; retrying", exc)
                stop.wait(2.0)
        else:
            return
        rate = args.rate * 4
        holder.append(simulate(config, sink, args.requests, rate=rate, stop=stop, progress=False))

    threading.Thread(target=produce, name="simulator", daemon=True).start()

    def make_store(partitions: int) -> StateStore:
        if args.redis:
            return build_store(settings, partitions)  # run() retries while unreachable
        return build_memory_store(settings, partitions)

    run(settings, stop, make_store, truth=lambda: holder[0].truth.as_dict() if holder else {})
    return holder[0] if holder else Simulator(config)


def _wait_for_redis(settings: Settings, partitions: int, stop: Any) -> Any:
    """The Redis store, retried with backoff while unreachable (health served meanwhile);
    None when stopped first."""
    from evaluator.app.run import build_store, serve_health, wait_for
    from evaluator.engine.loop import Health

    health = Health(None)
    early = serve_health(settings, health)
    try:
        return wait_for("Redis", lambda: build_store(settings, partitions), stop, health)
    finally:
        if early is not None:
            early.shutdown()
            early.server_close()


def add_demo(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "demo",
        parents=[config_option()],
        help="simulated traffic through the live pipeline, with a dashboard page (no services)",
    )
    add_service_flags(p)
    p.add_argument("--rate", type=float, default=300.0, help="requests/s (default 300)")
    p.add_argument("--speed", type=float, default=20.0, help="event time vs wall clock")
    p.add_argument(
        "--interleave",
        action="store_true",
        help="show every user a team-draft interleaving of the two variants' rankings",
    )
    p.add_argument("--requests", type=int, help="stop after this many requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kafka", action="store_true", help="through the configured Kafka topics")
    p.add_argument("--redis", action="store_true", help="state in the configured Redis")
    p.set_defaults(func=_cmd_demo)
