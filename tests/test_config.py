import pytest

from evaluator.app.cli import main
from evaluator.config import ConfigError, env_overrides, load_settings
from evaluator.core.propensity.models import PowerLaw


def write(tmp_path, text: str):
    path = tmp_path / "evaluator.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    s = load_settings(environ={})
    assert s.metrics.k == [10, 20]
    assert s.join.rules().attribution_window_ms == 30 * 60_000
    assert s.join.rules().max_clock_skew_ms == 5_000
    assert s.relevance.active().name == "ecommerce"
    assert s.cold_start.min_relevant_history == 3
    assert s.events.max_list_length == 1000
    assert s.event_time.ms("max_future") == 60_000  # NTP-synced producers: seconds of skew


def test_file_env_and_overrides_in_that_order(tmp_path) -> None:
    path = write(
        tmp_path, '[metrics]\nk = [5]\ngain = "linear"\n[join]\nattribution_window = "1h"\n'
    )
    env = {"EVALUATOR_METRICS__K": "[3, 7]", "EVALUATOR_PROPENSITY__MODEL": "power(1.0)"}
    s = load_settings(path, environ=env, overrides={"join": {"attribution_window": "10m"}})
    assert s.metrics.k == [3, 7]
    assert s.metrics.gain == "linear"
    assert s.join.rules().attribution_window_ms == 600_000
    assert s.scoring().propensity == PowerLaw(1.0)


def test_custom_relevance_profile(tmp_path) -> None:
    path = write(
        tmp_path,
        '[relevance]\nprofile = "mine"\n'
        "[relevance.profiles.mine]\ngrades = { like = 1, share = 4 }\n",
    )
    profile = load_settings(path, environ={}).relevance.active()
    assert profile.grade("share") == 4


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[metrics]\nk = [0]", "metrics"),
        ('[metrics]\ngain = "cubic"', "metrics.gain"),
        ('[join]\nattribution_window = "forever"', "join"),
        ("[metrics]\nkk = 1", "metrics"),
        ('[relevance]\nprofile = "nope"', "relevance"),
        ('[propensity]\nmodel = "magic"', "propensity"),
        ("[bogus]\nx = 1", "(top level)"),
        ('[event_time]\nmax_future = "soon"', "event_time"),
        ("[event_time]\nmax_future = -60000", "event_time"),
    ],
)
def test_errors_name_the_key(tmp_path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), environ={})
    message = str(info.value)
    assert "\n" not in message
    assert f"at {key}:" in message


def test_missing_and_malformed_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "missing.toml", environ={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(write(tmp_path, "[metrics"), environ={})


def test_env_overrides_parse_values() -> None:
    tree = env_overrides(
        {
            "EVALUATOR_METRICS__K": "[10]",
            "EVALUATOR_JOIN__MAX_CLOCK_SKEW": "2s",
            "OTHER": "x",
            "EVALUATOR_NOSECTION": "y",
        }
    )
    assert tree == {"metrics": {"k": [10]}, "join": {"max_clock_skew": "2s"}}


def test_example_file_documents_exactly_the_defaults() -> None:
    from pathlib import Path

    import msgspec

    example = Path(__file__).resolve().parents[1] / "evaluator.example.toml"
    documented = load_settings(example, environ={})
    assert msgspec.to_builtins(documented) == msgspec.to_builtins(load_settings(environ={}))


@pytest.mark.parametrize(
    ("env", "key", "allowed"),
    [
        ({"EVALUATOR_METRICS__GAIN": "cubic"}, "metrics.gain", "exponential, linear"),
        (
            {"EVALUATOR_PROPENSITY__ESTIMATOR": "magic"},
            "propensity.estimator",
            "none, randomized, harvesting, em",
        ),
    ],
)
def test_bad_choice_names_the_key_and_the_allowed_values(env, key, allowed) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(environ=env)
    message = str(info.value)
    assert key in message and f"allowed: {allowed}" in message and "\n" not in message


def test_config_check_exits_2_with_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setenv("EVALUATOR_KAFKA__AUTO_OFFSET_RESET", "middle")
    assert main(["config", "check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kafka.auto_offset_reset" in err and "earliest" in err


def test_estimated_propensity_needs_an_estimator() -> None:
    with pytest.raises(ConfigError, match="estimator"):
        load_settings(environ={"EVALUATOR_PROPENSITY__MODEL": "estimated"})


def test_cli_flags_override_file_and_environment(monkeypatch) -> None:
    from evaluator.app.cli import build_parser
    from evaluator.app.cli_common import service_overrides as _service_overrides

    args = build_parser().parse_args(["run", "--redis-url", "redis://r:1/2", "--port", "9"])
    monkeypatch.setenv("EVALUATOR_REDIS__URL", "redis://env:6379/0")
    settings = load_settings(overrides=_service_overrides(args))
    assert (settings.redis.url, settings.http.port) == ("redis://r:1/2", 9)
    assert settings.redis.cluster is False  # not given: the file/environment decide
    monkeypatch.setenv("EVALUATOR_REDIS__CLUSTER", "true")
    assert load_settings(overrides=_service_overrides(args)).redis.cluster is True
    flagged = build_parser().parse_args(["demo", "--redis-cluster"])
    assert load_settings(environ={}, overrides=_service_overrides(flagged)).redis.cluster


def test_logs_are_json_lines_when_not_on_a_terminal() -> None:
    import io
    import json
    import logging

    from evaluator.app.logs import setup_logging

    stream = io.StringIO()
    handler = setup_logging(stream=stream)
    try:
        logging.getLogger("evaluator.test").warning("lag is %d", 42)
        entry = json.loads(stream.getvalue().strip())
        assert entry["level"] == "warning" and entry["message"] == "lag is 42"
        assert entry["logger"] == "evaluator.test" and entry["time"].endswith("+00:00")
        text = io.StringIO()
        setup_logging(stream=text, fmt="text")
        logging.getLogger("evaluator.test").info("plain")
        assert "INFO evaluator.test: plain" in text.getvalue()
    finally:
        logging.getLogger().removeHandler(handler)


def test_every_setting_is_documented() -> None:
    """docs/configuration.md names every key of every section (kept in sync by this test)."""
    from pathlib import Path

    import msgspec

    from evaluator.config import Settings

    text = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    tree = msgspec.to_builtins(load_settings(environ={}))
    missing = []
    for section, values in tree.items():
        for key in values:
            if f"{section}.{key}" not in text and f"`{key}`" not in text:
                missing.append(f"{section}.{key}")
    assert not missing, missing
    assert set(tree) == set(Settings.__struct_fields__)


def test_state_ttl_must_outlast_an_open_request() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(
            environ={
                "EVALUATOR_REDIS__STATE_TTL": "20m",
                "EVALUATOR_JOIN__ATTRIBUTION_WINDOW": "30m",
            }
        )
    message = str(info.value)
    assert "redis.state_ttl" in message and "\n" not in message
    settings = load_settings(environ={"EVALUATOR_REDIS__FINALISED_TTL": "6h"})
    assert settings.redis.ttl_s("finalised_ttl") == 6 * 3600
    assert settings.redis.ttl_s("state_ttl") == 48 * 3600
    with pytest.raises(ConfigError, match="finalised_ttl"):
        load_settings(environ={"EVALUATOR_REDIS__FINALISED_TTL": "10s"})


@pytest.mark.parametrize(
    ("ab", "needle"),
    [
        ({"alpha": 2.0}, "alpha"),
        ({"tuning": -1}, "tuning"),
        ({"max_variants": 0}, "max_variants"),
        ({"min_users": 1}, "min_users"),
        ({"exposure_ttl": "often"}, "exposure_ttl"),
        ({"min_effective_buckets": 500}, "user_buckets"),
        ({"experiments": {"x": {"start": "2026-02-01T00:00:00Z", "end": 1}}}, "end"),
    ],
)
def test_ab_settings_are_validated(ab, needle) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_settings(environ={}, overrides={"ab": ab})


def test_environment_values_keep_their_text_where_a_setting_takes_text() -> None:
    """A Kubernetes Secret of digits is a password, not a number; a group id of digits
    is a group id; an instant is an instant (read as TOML they were an int, a
    datetime: the start-up stopped). Numbers, lists and booleans are still read as such."""
    settings = load_settings(
        environ={
            "EVALUATOR_REDIS__PASSWORD": "12345678",
            "EVALUATOR_KAFKA__SASL_PASSWORD": '"quoted"',
            "EVALUATOR_KAFKA__GROUP_ID": "123",
            "EVALUATOR_AB__CONTROL": "1",
            "EVALUATOR_AB__EXPERIMENTS__Launch__START": "2026-12-01T00:00:00Z",
            "EVALUATOR_AB__EXPERIMENTS__Launch__END": "1798761600000",
            "EVALUATOR_HTTP__PORT": "9100",
            "EVALUATOR_METRICS__K": "[5, 10]",
            "EVALUATOR_REDIS__CLUSTER": "true",
        }
    )
    assert settings.redis.password == "12345678"
    assert settings.kafka.sasl_password == '"quoted"'
    assert settings.kafka.group_id == "123" and settings.ab.control == "1"
    x = settings.ab.experiments["Launch"]
    assert (x.start, x.end) == ("2026-12-01T00:00:00Z", 1_798_761_600_000)
    assert settings.http.port == 9100 and settings.metrics.k == [5, 10]
    assert settings.redis.cluster is True


def test_environment_keeps_the_case_of_names_the_user_chose(tmp_path) -> None:
    """Experiment and variant names are case-sensitive: only the settings' own keys are
    lower-cased (before, ``...__SPLIT__Treatment`` gave a variant ``treatment`` with no
    traffic, and the SRM alert fired)."""
    path = tmp_path / "c.toml"
    path.write_text('[ab.experiments.Homepage]\ncontrol = "A"\n')
    settings = load_settings(
        path,
        environ={
            "EVALUATOR_AB__EXPERIMENTS__Homepage__CONTROL": "Control",
            "EVALUATOR_AB__SPLIT__Treatment": "0.5",
            "EVALUATOR_AB__SPLIT__Control": "0.5",
        },
    )
    assert list(settings.ab.experiments) == ["Homepage"]
    assert settings.ab.experiments["Homepage"].control == "Control"
    assert settings.ab.split == {"Treatment": 0.5, "Control": 0.5}
    # all in capitals, the usual style of environment names: lower case, as before (an
    # interaction type is usually written so), and matched to the file's keys by case
    settings = load_settings(
        path,
        environ={
            "EVALUATOR_AB__EXPERIMENTS__HOMEPAGE__CONTROL": "B",
            "EVALUATOR_RELEVANCE__PROFILES__SHOP2__GRADES__CLICK": "1",
            "EVALUATOR_RELEVANCE__PROFILE": "shop2",
            "EVALUATOR_PROPENSITY__MODEL": "[1.0, 0.5, 0.25]",
        },
    )
    assert {k: e.control for k, e in settings.ab.experiments.items()} == {"Homepage": "B"}
    assert settings.relevance.active().grades == {"click": 1.0}
    assert settings.propensity.model == [1.0, 0.5, 0.25]


def test_a_toml_date_time_is_an_instant(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[ab.experiments.X]\nstart = 2026-12-01T00:00:00Z\n")
    from datetime import UTC, datetime

    want = int(datetime(2026, 12, 1, tzinfo=UTC).timestamp() * 1000)
    assert load_settings(path, environ={}).ab.experiments["X"].start_ms() == want
    path.write_text("[ab.experiments.X]\nstart = 2026-12-01T00:00:00\n")
    with pytest.raises(ConfigError, match="no time zone"):
        load_settings(path, environ={})


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"EVALUATOR_KAFKA__SESSION_TIMEOUT": "1s"}, "kafka: session_timeout"),
        ({"EVALUATOR_KAFKA__SESSION_TIMEOUT": "2h"}, "kafka: session_timeout"),
        ({"EVALUATOR_KAFKA__SECURITY_PROTOCOL": "SASL_SSL"}, "sasl_mechanism must be one of"),
        (
            {
                "EVALUATOR_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
                "EVALUATOR_KAFKA__SASL_MECHANISM": "X",
            },
            "sasl_mechanism must be one of",
        ),
        ({"EVALUATOR_KAFKA__SASL_MECHANISM": "PLAIN"}, "needs security_protocol"),
        ({"EVALUATOR_KAFKA__FETCH_MIN_BYTES": "0"}, "kafka: fetch_min_bytes"),
        ({"EVALUATOR_KAFKA__FETCH_MAX_WAIT": "1m"}, "kafka: fetch_max_wait"),
    ],
)
def test_kafka_settings_that_can_never_connect_stop_start_up(env, needle) -> None:
    """Before, these passed ``config check`` and ``run`` then retried forever (kafka-python
    refuses a heartbeat of 1 s with a session of 1 s, and a SASL protocol without a
    mechanism)."""
    with pytest.raises(ConfigError, match=needle):
        load_settings(environ=env)


def test_a_mistyped_redis_url_does_not_print_its_password() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"EVALUATOR_REDIS__URL": "redis:/:s3cretpw@redis:6379/0"})
    assert "s3cretpw" not in str(caught.value) and "redis: url" in str(caught.value)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[relevance]\nprofile = "x"\n[relevance.profiles.x]\ngrades = {click = nan}\n', "click"),
        ("[ab]\ntuning = inf\n", "ab.tuning"),
        ("[ab]\nmin_effective_buckets = nan\n", "ab.min_effective_buckets"),
        ('[relevance]\nprofile = "x"\n[relevance.profiles.x]\ngrades = {click = 5000}\n', "0..100"),
    ],
)
def test_numbers_that_are_not_finite_or_absurd_are_refused(tmp_path, text, needle) -> None:
    """Before, a grade of nan made every request unengaged and nDCG 0, silently; inf
    gave n/a with a warning."""
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_settings(path, environ={})


def test_composite_names_are_checked_and_the_default_follows_k() -> None:
    """A typo, a K not in metrics.k or a bare set-level name made the live composite
    series disappear (NaN) without a word; replay --k 5 showed the default's n/a."""
    assert load_settings(environ={"EVALUATOR_METRICS__K": "[5]"}).metrics.composite == {
        "ndcg@5": 0.7,
        "coverage@5": 0.2,
        "diversity@5": 0.1,
    }
    for name in ("ndgc@10", "ndcg@30", "coverage"):
        with pytest.raises(ConfigError, match="composite: unknown metric"):
            load_settings(environ={f"EVALUATOR_METRICS__COMPOSITE__{name}": "1"})


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"EVALUATOR_REDIS__RETRY_ATTEMPTS": "-3"}, "retry_attempts"),
        ({"EVALUATOR_PROPENSITY__HISTORY": "36h"}, "whole days"),
        ({"EVALUATOR_AB__MAX_VARIANTS": "100000"}, "max_variants"),
        ({"EVALUATOR_AB__SPLIT__A": "0", "EVALUATOR_AB__SPLIT__B": "0"}, "at least one share"),
        ({"EVALUATOR_AB__EXPERIMENTS__X__SPLIT__A": "0"}, "at least one share"),
    ],
)
def test_bounds_of_counts_and_shares(env, needle) -> None:
    """Negative retries are infinite in redis-py; an unbounded max_variants unbounds the
    labels; an all-zero split made the SRM p-value NaN without a word."""
    with pytest.raises(ConfigError, match=needle):
        load_settings(environ=env)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-inf"])
def test_text_that_reads_as_a_number_that_is_not_finite_is_refused(text) -> None:
    """Not TOML, so kept as text, then converted to a float by the settings' type."""
    with pytest.raises(ConfigError, match=r"ab\.tuning"):
        load_settings(environ={"EVALUATOR_AB__TUNING": text})


def test_engine_settings_keep_their_old_redis_names() -> None:
    """``[engine]`` is the engine settings' home; the ``[redis]`` names of earlier
    versions are still read, in a file or the environment, and the two must agree."""
    default = load_settings(environ={})
    assert default.engine.ms("checkpoint_interval") == 1_000
    assert default.engine.ttl_s("finalised_ttl") == 6 * 3600
    old = load_settings(environ={"EVALUATOR_REDIS__FINALISED_TTL": "12h"})
    new = load_settings(overrides={"engine": {"finalised_ttl": "12h"}}, environ={})
    for settings in (old, new):
        assert settings.engine.ttl_s("finalised_ttl") == 12 * 3600
        assert settings.redis.ttl_s("finalised_ttl") == 12 * 3600
    interval = {"EVALUATOR_REDIS__CHECKPOINT_INTERVAL": "250ms"}
    assert load_settings(environ=interval).engine.ms("checkpoint_interval") == 250
    same = {**interval, "EVALUATOR_ENGINE__CHECKPOINT_INTERVAL": "250"}
    assert load_settings(environ=same).engine.ms("checkpoint_interval") == 250
    with pytest.raises(ConfigError, match=r"engine\.checkpoint_interval .* redis\.checkpoint"):
        load_settings(environ={**interval, "EVALUATOR_ENGINE__CHECKPOINT_INTERVAL": "2s"})
    with pytest.raises(ConfigError, match=r"engine.*finalised_ttl must be at least 1m"):
        load_settings(environ={"EVALUATOR_ENGINE__FINALISED_TTL": "10s"})


def test_the_retired_exposure_ttl_still_loads_and_is_reported() -> None:
    """Configuration files that set ``ab.exposure_ttl`` (exposures are now kept for an
    experiment's life) still load; a value other than 0 is reported, naming the key."""
    assert load_settings(environ={}).ab.deprecated() == []
    old = load_settings(environ={}, overrides={"ab": {"exposure_ttl": "30d"}})
    (line,) = old.ab.deprecated()
    assert line.startswith("ab.exposure_ttl ")
