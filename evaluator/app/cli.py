"""Command-line entry point: ``evaluator <command>``; the composition root for each job."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from evaluator import __version__
from evaluator.app.logs import setup_logging
from evaluator.config import ConfigError, Settings, load_settings, masked
from evaluator.engine.runtime import tune_gc


class UsageError(Exception):
    """A usage problem reported in one line with exit code 2."""


EXIT_ERROR = 2
"""Usage, configuration or environment errors (one line on stderr)."""
EXIT_BUG = 1
"""An unexpected internal error (a bug: one line; EVALUATOR_TRACEBACK=1 shows it all)."""


class _Parser(argparse.ArgumentParser):
    """Argument errors in one line (exit 2), pointing at ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive(**values: float | None) -> None:
    """Flags that must be positive when given (one line, exit 2)."""
    for name, value in values.items():
        if value is not None and not value > 0:
            raise UsageError(f"--{name} must be positive, got {value}")


def _port_free(host: str, port: int) -> int:
    """Refuse a taken or forbidden HTTP port before anything claims to be serving; the
    port to serve on (port 0: one the system picks now, so it can be printed)."""
    import socket

    # the server binds IPv4 (http.server's default family): probe the same
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host or "0.0.0.0", port))
            probe.listen()
        except socket.gaierror as exc:
            raise UsageError(f"http.host {host!r} does not resolve: {exc.strerror}") from None
        except OSError as exc:
            raise UsageError(
                f"cannot serve on {host}:{port} (http.port, --port): {exc.strerror}"
            ) from None
        return int(probe.getsockname()[1])


def _replay_overrides(args: argparse.Namespace) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    if args.k:
        tree.setdefault("metrics", {})["k"] = args.k
    if args.gain:
        tree.setdefault("metrics", {})["gain"] = args.gain
    if args.zero_relevance:
        tree.setdefault("metrics", {})["zero_relevance"] = args.zero_relevance
    if args.relevance:
        tree.setdefault("relevance", {})["profile"] = args.relevance
    if args.attribution_window:
        tree.setdefault("join", {})["attribution_window"] = args.attribution_window
    if args.propensity:
        tree.setdefault("propensity", {})["model"] = args.propensity
        if args.propensity == "estimated" and not args.estimator:
            tree["propensity"].setdefault("estimator", "em")
    if args.estimator:
        tree.setdefault("propensity", {})["estimator"] = args.estimator
    return tree


def _cmd_replay(args: argparse.Namespace) -> int:
    from evaluator.app.replay import evaluate_files, print_report

    settings = load_settings(args.config, overrides=_replay_overrides(args))
    for path in (args.impressions, args.interactions):
        _readable(path)
    _refuse_swapped(args.impressions, args.interactions, settings)
    progress = False if args.no_progress else None
    report = evaluate_files(
        args.impressions,
        args.interactions,
        settings,
        progress,
        args.estimate_propensity,
        now_ms=_instant("--now", args.now),
    )
    print_report(report, args.output)
    for damage in report["events"]["incomplete"]:
        print(f"evaluator: error: {damage}", file=sys.stderr)
    return EXIT_INCOMPLETE if report["events"]["incomplete"] else 0


EXIT_INCOMPLETE = 3
"""``replay``'s exit code when an input file was damaged: the report covers the lines
before the damage."""


def _instant(flag: str, value: str | None) -> int | None:
    """An instant flag in epoch ms (None when not given); one line (exit 2) when bad."""
    from evaluator.core.events import MAX_TIMESTAMP_MS
    from evaluator.core.timeutil import parse_instant_ms

    if value is None:
        return None
    try:
        ms = parse_instant_ms(int(value) if value.strip().isdigit() else value)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    if not 0 <= ms <= MAX_TIMESTAMP_MS:
        raise UsageError(f"{flag}: {value} is not between 1970 and 9999")
    return ms


def _readable(path: Path) -> None:
    """One clear line (exit 2) for an event file that cannot be read."""
    if path.is_dir():
        raise UsageError(f"{path} is a directory; give a JSON Lines file (optionally .gz)")
    if not path.exists():
        raise UsageError(f"no such file: {path}")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None


def _refuse_swapped(impressions: Path, interactions: Path, settings: Settings) -> None:
    """Files given in the wrong order are a usage error, not a report of invalid lines:
    the first lines of the impressions file decode as interactions and none as
    impressions."""
    from evaluator.adapters.files import read_jsonl
    from evaluator.core.events import decode_impressions, decode_interactions

    try:
        sample = next(read_jsonl(impressions, chunk_lines=20), None)
    except ValueError:  # damaged from the first byte: reported by the replay itself
        return
    if sample is None:
        return
    as_impressions, _ = decode_impressions(sample.payloads, settings.events.max_list_length)
    as_interactions, _ = decode_interactions(sample.payloads, settings.relevance.active())
    if not as_impressions.events and len(as_interactions.events) * 2 >= len(sample.payloads):
        raise UsageError(
            f"{impressions} holds interactions, not impressions: are the files swapped? "
            "(usage: evaluator replay IMPRESSIONS INTERACTIONS)"
        )


def _service_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """CLI flags for the common service settings (they win over file and environment)."""
    tree: dict[str, Any] = {}
    for flag, section, key in (
        ("bootstrap_servers", "kafka", "bootstrap_servers"),
        ("group_id", "kafka", "group_id"),
        ("redis_url", "redis", "url"),
        ("redis_cluster", "redis", "cluster"),
        ("port", "http", "port"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            tree.setdefault(section, {})[key] = value
    return tree


def _add_service_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (kafka.bootstrap_servers)")
    p.add_argument("--group-id", help="Kafka consumer group (kafka.group_id)")
    p.add_argument("--redis-url", help="redis://host:port/db (redis.url)")
    p.add_argument(
        "--redis-cluster",
        action="store_true",
        default=None,
        help="--redis-url names a Redis Cluster node (redis.cluster)",
    )
    p.add_argument("--port", type=int, help="/metrics and dashboard port (http.port)")


def _cmd_run(args: argparse.Namespace) -> int:
    import threading

    from evaluator.app.run import install_signal_handlers, run

    setup_logging()
    settings = load_settings(args.config, overrides=_service_overrides(args))
    _port_free(settings.http.host, settings.http.port)
    stop = threading.Event()
    install_signal_handlers(stop)
    return run(settings, stop)


def _cmd_simulate(args: argparse.Namespace) -> int:
    import threading

    from evaluator.app.run import install_signal_handlers
    from evaluator.app.simulate import FileSink, config_from_args, simulate, write_truth

    settings = load_settings(args.config)
    setup_logging()
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
    }
    try:
        config = config_from_args(settings, args.seed, args.variant, options, args.start_ms)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.out_dir is None and not args.kafka:
        raise UsageError("name a destination: --out-dir DIR or --kafka")
    _positive(requests=args.requests, rate=args.rate if args.rate else None)
    stop = threading.Event()
    install_signal_handlers(stop)
    if args.kafka:
        import time

        from evaluator.adapters.kafka import KafkaSink

        if args.start_ms is None:
            config = config_from_args(
                settings, args.seed, args.variant, options, time.time_ns() // 1_000_000
            )
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


def _add_simulate(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "simulate",
        parents=[_config_option()],
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
        "--start-ms",
        type=int,
        help="first event time (default: 2026-01-01; with --kafka, now, and each event is "
        "produced once the wall clock reaches its time, as live traffic)",
    )
    p.add_argument("--truth", type=Path, help="ground-truth JSON path (default: stdout/out-dir)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_cmd_simulate)


def _cmd_demo(args: argparse.Namespace) -> int:
    import threading

    import msgspec

    from evaluator.app.demo import DEMO_PARTITIONS, demo_tree, run_demo, sim_config
    from evaluator.app.run import build_store, install_signal_handlers, run
    from evaluator.config import load_tree
    from evaluator.engine.ports import StateStore

    _positive(requests=args.requests, rate=args.rate, speed=args.speed)
    overrides = _service_overrides(args)
    settings = load_settings(None, overrides=demo_tree(load_tree(args.config, overrides=overrides)))
    port = _port_free(settings.http.host, settings.http.port)
    if port != settings.http.port:
        http = msgspec.structs.replace(settings.http, port=port)
        settings = msgspec.structs.replace(settings, http=http)
    setup_logging()
    stop = threading.Event()
    install_signal_handlers(stop)
    print(
        f"evaluator demo: dashboard on http://{settings.http.host}:{settings.http.port}/ "
        "(Ctrl-C stops)",
        file=sys.stderr,
    )
    if not args.kafka:
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
        )
    else:
        from evaluator.adapters.kafka import KafkaSink
        from evaluator.app.demo import build_memory_store
        from evaluator.app.simulate import simulate
        from evaluator.core.simulator import Simulator

        config = sim_config(settings, args.seed, args.rate, args.speed)
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
            holder.append(
                simulate(
                    config,
                    sink,
                    args.requests,
                    rate=args.rate * 4,
                    stop=stop,
                    progress=False,
                )
            )

        threading.Thread(target=produce, name="simulator", daemon=True).start()

        def make_store(partitions: int) -> StateStore:
            if args.redis:
                return build_store(settings, partitions)  # run() retries while unreachable
            return build_memory_store(settings, partitions)

        run(settings, stop, make_store, truth=lambda: holder[0].truth.as_dict() if holder else {})
        simulator = holder[0] if holder else Simulator(config)
    json.dump(simulator.truth.as_dict(), sys.stderr, indent=2)
    sys.stderr.write("\n")
    return 0


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


def _add_demo(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "demo",
        parents=[_config_option()],
        help="simulated traffic through the live pipeline, with a dashboard page (no services)",
    )
    _add_service_flags(p)
    p.add_argument("--rate", type=float, default=300.0, help="requests/s (default 300)")
    p.add_argument("--speed", type=float, default=20.0, help="event time vs wall clock")
    p.add_argument("--requests", type=int, help="stop after this many requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kafka", action="store_true", help="through the configured Kafka topics")
    p.add_argument("--redis", action="store_true", help="state in the configured Redis")
    p.set_defaults(func=_cmd_demo)


def _cmd_schema(args: argparse.Namespace) -> int:
    from evaluator.core.events import json_schemas

    schemas = json_schemas()
    if args.out_dir is None:
        json.dump(schemas, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, schema in schemas.items():
        path = args.out_dir / f"{name}.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        print(path)
    return 0


def _cmd_config_check(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    sys.stdout.write(json.dumps(masked(settings), indent=2) + "\n")
    return 0


def _config_option() -> _Parser:
    """``--config`` accepted after the subcommand too (it must not reset the top-level one)."""
    parent = _Parser(add_help=False)
    parent.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="evaluator.toml")
    return parent


def _add_replay(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "replay",
        parents=[_config_option()],
        help="evaluate impression and interaction JSON Lines files (optionally .gz)",
        description="Join, grade and score recorded events with the live pipeline's core.",
    )
    p.add_argument("impressions", type=Path, help="impressions JSON Lines file")
    p.add_argument("interactions", type=Path, help="interactions JSON Lines file")
    p.add_argument("--k", type=int, action="append", help="cutoff K (repeatable; default 10, 20)")
    p.add_argument(
        "--gain", choices=["exponential", "linear"], help="nDCG gain (default exponential)"
    )
    p.add_argument("--relevance", help="relevance profile (default ecommerce)")
    p.add_argument("--attribution-window", help="e.g. 30m (default), 1h, 90s")
    p.add_argument("--propensity", help="none (default), power(ETA), table:T1,T2,... or estimated")
    p.add_argument("--estimator", choices=["randomized", "harvesting", "em"])
    p.add_argument(
        "--estimate-propensity",
        action="store_true",
        help="estimate position propensities from the file and print the curves",
    )
    p.add_argument(
        "--zero-relevance",
        choices=["count", "skip"],
        help="requests without a relevant item: count as 0 (default) or skip",
    )
    p.add_argument(
        "--now",
        help="the clock events are checked against: an event stamped later than this + "
        "event_time.max_future is invalid (future_timestamp), as live at consumption; an "
        "instant such as 2026-12-01T00:00:00Z or epoch ms (default: the run's time)",
    )
    p.add_argument("--output", choices=["table", "json"], default="table")
    p.add_argument("--no-progress", action="store_true", help="never show the progress bar")
    p.set_defaults(func=_cmd_replay)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="evaluator", description="Streaming online evaluator for recommender systems."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--config", type=Path, help="evaluator.toml (default: built-in defaults)")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    _add_replay(sub)
    _add_simulate(sub)
    _add_demo(sub)
    run = sub.add_parser(
        "run",
        parents=[_config_option()],
        help="consume Kafka, keep state in Redis, maintain sliding-window metrics",
    )
    _add_service_flags(run)
    run.set_defaults(func=_cmd_run)
    schema = sub.add_parser("schema", help="print or write the JSON Schemas of the events")
    schema.add_argument("--out-dir", type=Path, help="write <name>.schema.json files here")
    schema.set_defaults(func=_cmd_schema)
    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(
        dest="config_command", required=True, metavar="ACTION", parser_class=_Parser
    )
    check = config_sub.add_parser(
        "check", parents=[_config_option()], help="validate and print the effective configuration"
    )
    check.set_defaults(func=_cmd_config_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    tune_gc()
    try:
        code: int = args.func(args)
    except (ConfigError, UsageError) as exc:
        print(f"evaluator: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # files and sockets: the environment, not a bug
        where = f": {exc.filename}" if exc.filename else ""
        print(f"evaluator: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # a bug: one line, the traceback on request
        if os.environ.get("EVALUATOR_TRACEBACK"):
            raise
        print(
            f"evaluator: internal error: {type(exc).__name__}: {exc} "
            "(EVALUATOR_TRACEBACK=1 shows the traceback; please report it)",
            file=sys.stderr,
        )
        return EXIT_BUG
    return code


__all__ = ["Settings", "main"]
