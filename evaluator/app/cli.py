"""Command-line entry point: ``evaluator <command>``; the composition root for each job."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evaluator import __version__
from evaluator.app.cli_common import (
    EXIT_BUG,
    EXIT_ERROR,
    Parser,
    UsageError,
    add_service_flags,
    config_option,
    port_free,
    service_overrides,
)
from evaluator.app.cli_generate import add_demo, add_simulate
from evaluator.app.logs import setup_logging
from evaluator.config import ConfigError, Settings, load_settings, masked
from evaluator.engine.runtime import tune_gc, tune_malloc


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
    from evaluator.core.decode import decode_impressions, decode_interactions

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


def _cmd_run(args: argparse.Namespace) -> int:
    import threading

    from evaluator.app.run import install_signal_handlers, run

    setup_logging()
    settings = load_settings(args.config, overrides=service_overrides(args))
    log = logging.getLogger("evaluator")
    for line in settings.ab.deprecated():
        log.warning("%s", line)
    port_free(settings.http.host, settings.http.port)
    stop = threading.Event()
    install_signal_handlers(stop)
    return run(settings, stop)


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


def _add_replay(sub: argparse._SubParsersAction[Parser]) -> None:
    p = sub.add_parser(
        "replay",
        parents=[config_option()],
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
    parser = Parser(
        prog="evaluator", description="Streaming online evaluator for recommender systems."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--config", type=Path, help="evaluator.toml (default: built-in defaults)")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser
    )
    _add_replay(sub)
    add_simulate(sub)
    add_demo(sub)
    run = sub.add_parser(
        "run",
        parents=[config_option()],
        help="consume Kafka, keep state in Redis, maintain sliding-window metrics",
    )
    add_service_flags(run)
    run.set_defaults(func=_cmd_run)
    schema = sub.add_parser("schema", help="print or write the JSON Schemas of the events")
    schema.add_argument("--out-dir", type=Path, help="write <name>.schema.json files here")
    schema.set_defaults(func=_cmd_schema)
    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(
        dest="config_command", required=True, metavar="ACTION", parser_class=Parser
    )
    check = config_sub.add_parser(
        "check", parents=[config_option()], help="validate and print the effective configuration"
    )
    check.set_defaults(func=_cmd_config_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    tune_gc()
    tune_malloc()
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
