"""Process logging: JSON lines when stderr is not a terminal (collectors parse them),
readable text on a terminal. ``EVALUATOR_LOG_FORMAT=json|text`` forces either."""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import TextIO


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message (+ exception)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(
    level: int = logging.INFO, stream: TextIO | None = None, fmt: str | None = None
) -> logging.Handler:
    """Install one handler on the root logger; returns it."""
    stream = stream or sys.stderr
    choice = fmt or os.environ.get("EVALUATOR_LOG_FORMAT", "")
    as_json = choice == "json" or (choice != "text" and not stream.isatty())
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        JsonFormatter()
        if as_json
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
