"""``evaluator simulate``: write simulated traffic to JSON Lines files or to Kafka."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Protocol

from tqdm import tqdm

from evaluator.config import Settings
from evaluator.core.seasons import Regression, Seasons, out_of_range
from evaluator.core.simulator import T0_MS, Kind, SimEvent, SimulationConfig, Simulator
from evaluator.core.timeutil import format_instant_ms, parse_duration_ms, parse_instant_ms


class EventSink(Protocol):
    """Where simulated events go (files, Kafka, or an in-process pipeline)."""

    def send(self, kind: Kind, key: bytes, payload: bytes) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class FileSink:
    """``impressions.jsonl`` and ``interactions.jsonl`` in a directory."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.paths = {
            "impressions": directory / "impressions.jsonl",
            "interactions": directory / "interactions.jsonl",
        }
        self._files: dict[str, IO[bytes]] = {k: open(p, "wb") for k, p in self.paths.items()}  # noqa: SIM115

    def send(self, kind: str, key: bytes, payload: bytes) -> None:
        handle = self._files[kind]
        handle.write(payload)
        handle.write(b"\n")

    def flush(self) -> None:
        for handle in self._files.values():
            handle.flush()

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()


class RateLimiter:
    """Paces a producer to ``rate`` events per second (0: unlimited) in wall-clock time."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.clock = clock
        self.started = clock()
        self.sent = 0

    def delay(self, n: int) -> float:
        """Seconds to wait before the next ``n`` events may go."""
        self.sent += n
        if self.rate <= 0:
            return 0.0
        return max(0.0, self.started + self.sent / self.rate - self.clock())


def pump(
    chunks: Iterator[list[SimEvent]],
    sink: EventSink,
    limiter: RateLimiter,
    stop: threading.Event,
    on_chunk: Callable[[int], object] = lambda n: None,
    *,
    ahead_s: Callable[[], float] = lambda: 0.0,
) -> int:
    """Send chunks to the sink at the limiter's pace until exhausted or stopped. Each
    chunk is held until ``ahead_s`` (how far its events are stamped ahead of the wall
    clock, in seconds) is no longer positive."""
    total = 0
    for chunk in chunks:
        hold = ahead_s()
        if hold > 0:
            sink.flush()
            if stop.wait(hold):
                break
        for event in chunk:
            sink.send(event.kind, event.key, event.payload)
        total += len(chunk)
        on_chunk(len(chunk))
        wait = limiter.delay(len(chunk))
        if wait > 0:
            sink.flush()
            if stop.wait(wait):
                break
        elif stop.is_set():
            break
    sink.flush()
    return total


def simulate(
    config: SimulationConfig,
    sink: EventSink,
    requests: int | None,
    *,
    rate: float = 0.0,
    stop: threading.Event | None = None,
    progress: bool | None = None,
    live: bool = False,
) -> Simulator:
    """Run the simulator into ``sink``; returns it, holding the ground truth. ``live``:
    no event is sent before the wall clock reaches its time, so event time never runs
    ahead of the clock (an evaluator would refuse such events: ``event_time.max_future``)."""
    simulator = Simulator(config)

    def ahead_s() -> float:
        return (simulator.clock_ms - time.time_ns() / 1e6) / 1000.0 if live else 0.0

    stop = stop or threading.Event()
    with tqdm(
        total=requests,
        unit="req",
        desc="simulate",
        disable=progress is False if progress is not None else None,
        file=sys.stderr,
        leave=False,
    ) as bar:
        last = [0]

        def advance(_: int) -> None:
            bar.update(simulator.generated - last[0])
            last[0] = simulator.generated

        try:
            pump(
                simulator.chunks(requests), sink, RateLimiter(rate), stop, advance, ahead_s=ahead_s
            )
        finally:
            sink.close()
    return simulator


def write_truth(simulator: Simulator, path: Path | None) -> None:
    """The ground truth as JSON: to ``path``, or to stdout."""
    text = json.dumps(simulator.truth.as_dict(), indent=2) + "\n"
    if path is None:
        sys.stdout.write(text)
    else:
        path.write_text(text)


def config_from_args(
    settings: Settings,
    seed: int,
    variants: list[str] | None,
    options: dict[str, float | int | str | None],
    start_ms: int | None,
    *,
    seasons: dict[str, float | None] | None = None,
    regression: str | None = None,
) -> SimulationConfig:
    """A simulation config from CLI values; cutoffs and gain follow the evaluator's.
    ``seasons``: Seasons fields by name (None: not given); ``regression``: the
    ``--inject-regression`` value. A ValueError names the flag at fault."""
    parsed: list[tuple[str, float]] = []
    for spec in variants or []:
        name, _, noise = spec.partition(":")
        try:
            level = float(noise or 1.0)
        except ValueError:
            raise ValueError(f"--variant {spec!r}: use NAME:NOISE, e.g. treatment:0.4") from None
        if not name.strip() or name in {n for n, _ in parsed}:
            raise ValueError(f"--variant {spec!r}: each variant needs a name of its own")
        if not math.isfinite(level) or level < 0:
            raise ValueError(f"--variant {spec!r}: the noise must be a number >= 0")
        parsed.append((name, level))
    kwargs: dict[str, object] = {k: v for k, v in options.items() if v is not None}
    if parsed:
        kwargs["variants"] = tuple(parsed)
    if start_ms is not None:
        kwargs["start_ms"] = start_ms
    if seasons and any(v is not None for v in seasons.values()):
        kwargs["seasons"] = season_flags(seasons)
    if regression is not None:
        names = [n for n, _ in parsed] or [n for n, _ in SimulationConfig().variants]
        eligible = names[:2] if options.get("interleave") else names
        kwargs["regression"] = parse_regression(
            regression, eligible, T0_MS if start_ms is None else start_ms
        )
    return SimulationConfig(
        seed=seed,
        ks=tuple(settings.metrics.k),
        gain=settings.metrics.gain,
        **kwargs,  # type: ignore[arg-type]
    )


def season_flags(values: dict[str, float | None]) -> Seasons:
    """``--daily-amplitude``, ``--weekly-dip``, ``--relevance-amplitude`` (Seasons
    fields by name; None: not given) as seasons; a ValueError names the flag."""
    given = {name: value for name, value in values.items() if value is not None}
    for name, value in given.items():
        reason = out_of_range(name, value)
        if reason is not None:
            raise ValueError(f"--{name.replace('_', '-')} {reason}")
    return Seasons(
        daily_amplitude=given.get("daily_amplitude", 0.0),
        weekly_dip=given.get("weekly_dip", 0.0),
        relevance_amplitude=given.get("relevance_amplitude", 0.0),
    )


def parse_regression(spec: str, variants: list[str], start_ms: int) -> Regression:
    """``--inject-regression VARIANT:DROP:AFTER``: DROP a share (0.03) or a percentage
    (3%); AFTER a duration after the simulation's start (6h, 90m, 250ms; digits are
    ms) or an instant (2026-01-01T06:00:00Z). A ValueError names the flag."""
    flag = f"--inject-regression {spec!r}"
    name, _, rest = spec.partition(":")
    drop_text, _, after_text = rest.partition(":")
    if not name.strip() or not drop_text.strip() or not after_text.strip():
        raise ValueError(f"{flag}: use VARIANT:DROP:AFTER, e.g. treatment:0.03:6h")
    if name not in variants:
        raise ValueError(f"{flag}: {name!r} is not a variant here ({', '.join(variants)})")
    try:
        text = drop_text.strip()
        drop = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f"{flag}: DROP must be a share such as 0.03 (or 3%)") from None
    reason = out_of_range("drop", drop)
    if reason is not None:
        raise ValueError(f"{flag}: DROP {reason}")
    return Regression(name, drop, _after_ms(flag, after_text, start_ms))


def _after_ms(flag: str, text: str, start_ms: int) -> int:
    """AFTER of ``--inject-regression``: ms after the simulation's start."""
    try:
        return parse_duration_ms(text)
    except ValueError:
        pass
    try:
        after = parse_instant_ms(text) - start_ms
    except ValueError:
        raise ValueError(
            f"{flag}: AFTER must be a duration after the start such as 6h, or an instant "
            "such as 2026-01-01T06:00:00Z"
        ) from None
    if after < 0:
        start = format_instant_ms(start_ms)
        raise ValueError(f"{flag}: AFTER is before the simulation's start ({start})")
    return after
