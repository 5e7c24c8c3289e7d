"""Command-line entry point: ``evaluator <command>``; the composition root for each job."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evaluator import __version__
from evaluator.config import ConfigError, Settings, load_settings, masked


class UsageError(Exception):
    """A usage problem reported in one line with exit code 2."""


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
    return tree


def _cmd_replay(args: argparse.Namespace) -> int:
    from evaluator.commands.replay import evaluate_files, print_report

    settings = load_settings(args.config, overrides=_replay_overrides(args))
    for path in (args.impressions, args.interactions):
        if not path.is_file():
            raise UsageError(f"no such file: {path}")
    progress = False if args.no_progress else None
    report = evaluate_files(args.impressions, args.interactions, settings, progress)
    print_report(report, args.output)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import logging
    import threading

    from evaluator.commands.run import install_signal_handlers, run

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = load_settings(args.config)
    stop = threading.Event()
    install_signal_handlers(stop)
    return run(settings, stop)


def _cmd_schema(args: argparse.Namespace) -> int:
    from evaluator.events import json_schemas

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


def _config_option() -> argparse.ArgumentParser:
    """``--config`` accepted after the subcommand too (it must not reset the top-level one)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="evaluator.toml")
    return parent


def _add_replay(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument("--propensity", help="none (default), power(ETA) or table:T1,T2,...")
    p.add_argument(
        "--zero-relevance",
        choices=["count", "skip"],
        help="requests without a relevant item: count as 0 (default) or skip",
    )
    p.add_argument("--output", choices=["table", "json"], default="table")
    p.add_argument("--no-progress", action="store_true", help="never show the progress bar")
    p.set_defaults(func=_cmd_replay)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evaluator", description="Streaming online evaluator for recommender systems."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--config", type=Path, help="evaluator.toml (default: built-in defaults)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_replay(sub)
    run = sub.add_parser(
        "run",
        parents=[_config_option()],
        help="consume Kafka, keep state in Redis, maintain sliding-window metrics",
    )
    run.set_defaults(func=_cmd_run)
    schema = sub.add_parser("schema", help="print or write the JSON Schemas of the events")
    schema.add_argument("--out-dir", type=Path, help="write <name>.schema.json files here")
    schema.set_defaults(func=_cmd_schema)
    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = config_sub.add_parser(
        "check", parents=[_config_option()], help="validate and print the effective configuration"
    )
    check.set_defaults(func=_cmd_config_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except (ConfigError, UsageError) as exc:
        print(f"evaluator: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return code


__all__ = ["Settings", "main"]
