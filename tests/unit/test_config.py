"""Settings: file, then environment, then overrides; bad input gives a clear ConfigError."""

from __future__ import annotations

import pytest

from broker.core.config import load_settings
from broker.core.errors import ConfigError


def test_file_values_are_overridden_by_environment_and_keywords(tmp_path, monkeypatch):
    path = tmp_path / "b.toml"
    path.write_text('qm = "FILEQM"\nbatch_size = 7\nconcurrency = 3\n')
    monkeypatch.setenv("BROKER_BATCH_SIZE", "9")
    settings = load_settings(path, concurrency=5)
    assert (settings.qm, settings.batch_size, settings.concurrency) == ("FILEQM", 9, 5)


def test_defaults_without_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BROKER_CONFIG", raising=False)
    settings = load_settings()
    assert settings.redis_url == "redis://127.0.0.1:6380/0" and settings.lease_ms == 30_000


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("qm = ", "not valid TOML"),
        ("no_such_setting = 1", "unknown setting(s) no_such_setting"),
        ('concurrency = "many"', "concurrency"),
        ('redis_url = "http://x"', "redis_url"),
        ('qm = "has space"', "qm"),
        (
            "flow_control_start_depth = 100\nflow_control_full_depth = 100",
            "flow_control_full_depth: Value error, must be above flow_control_start_depth (100)",
        ),
        ("flow_control_start_depth = -1", "flow_control_start_depth"),
        ("flow_control_max_delay_ms = 0", "flow_control_max_delay_ms"),
        ('[[slow_subscriber_conditions]]\nname = "feed"\nmax_messages = 0', "max_messages"),
        ('[[slow_subscriber_conditions]]\nname = "feed"\npersistence_mode = "sometimes"', "persistence_mode"),
        ('[[slow_subscriber_conditions]]\nname = "feed"\nsubscription_type = "nearby"', "subscription_type"),
        ('[[slow_subscriber_conditions]]\nname = "feed"\nmax_message = 10', "max_message"),
        (
            "[[slow_subscriber_conditions]]\nmax_messages = 10",
            "slow_subscriber_conditions.0.name: Field required",
        ),
        ('[[slow_subscriber_conditions]]\nname = "feed/x"', "is not a root topic of the mqtt scheme"),
        ('[[slow_subscriber_conditions]]\nname = "+"', "is not a root topic"),
        (
            'topic_scheme = "swiftmq"\n[[slow_subscriber_conditions]]\nname = "feed.bloomberg"',
            "is not a root topic of the swiftmq scheme",
        ),
        (
            '[[slow_subscriber_conditions]]\nname = "feed"\n[[slow_subscriber_conditions]]\nname = "feed"\n'
            "max_messages = 5",
            "slow_subscriber_conditions: Value error, two conditions for the root topic 'feed'",
        ),
    ],
)
def test_bad_config_file_gives_a_clear_error_naming_the_file(tmp_path, text, fragment):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert fragment in str(info.value)
    assert "bad.toml" in str(info.value)
    assert info.value.exit_code == 2


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")


def test_bad_environment_value_is_a_config_error(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BROKER_LEASE_MS", "soon")
    with pytest.raises(ConfigError, match="lease_ms"):
        load_settings()


def test_shipped_config_file_is_valid():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    settings = load_settings(root / "configs" / "broker.toml")
    assert settings.qm == "QM1"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:secret@host:6380/0", "redis://user:***@host:6380/0"),
        ("redis://:secret@host/0", "redis://:***@host/0"),
        ("rediss://u:p%40ss@[::1]:6380/1", "rediss://u:***@[::1]:6380/1"),
        ("redis://127.0.0.1:6380/0", "redis://127.0.0.1:6380/0"),
    ],
)
def test_redact_url_hides_only_the_password(url, shown):
    from broker.core.connection import redact_url

    assert redact_url(url) == shown


def test_a_server_config_that_does_not_exist_is_a_clear_error_and_the_default_is_packaged():
    from pathlib import Path

    from broker.core.config import Settings, load_settings
    from broker.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"server_config: .*no such file"):
        load_settings(None, server_config="/nonexistent/redis.conf")
    packaged = Path(Settings().server_config_file())
    assert packaged.is_file() and "appendonly yes" in packaged.read_text()


def test_public_entry_points_raise_broker_errors_not_redis_py_errors():
    import redis

    from broker import ConnectionLost, Subscriber, explain, link, list_subscriptions, status, subscribe
    from broker.topics.subscriptions import SubscriptionRecord

    down = redis.Redis(port=1, socket_connect_timeout=0.2, retry_on_error=[], retry=None)
    record = SubscriptionRecord("app$x", "/a", True, 0)
    calls = [
        lambda: subscribe(down, "Q", "/a", "app", "x"),
        lambda: list_subscriptions(down, "Q"),
        lambda: link(down, "Q", "/a", "/b"),
        lambda: explain(down, "Q", "/a"),
        lambda: status(down, "Q"),
        lambda: Subscriber(down, "Q", record),
    ]
    for call in calls:
        with pytest.raises(ConnectionLost):
            call()


# -- flow control and slow-subscriber conditions (issue 12) ------------------------------------


def test_flow_control_defaults_and_curve(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BROKER_CONFIG", raising=False)
    settings = load_settings()
    assert settings.flowcontrol_enabled is True
    assert (settings.flow_control_start_depth, settings.flow_control_full_depth) == (1_000, 100_000)
    assert settings.flow_control_max_delay_ms == 1_000
    assert settings.slow_subscriber_conditions == []
    # 0 up to the start depth, linear (rounded down) to the max at the full depth, capped
    assert [settings.flow_control_delay_ms(d) for d in (0, 1_000, 1_100, 50_500, 99_999, 100_000, 10**7)] == [
        0,
        0,
        1,
        500,
        999,
        1_000,
        1_000,
    ]
    assert load_settings(flowcontrol_enabled=False).flow_control_delay_ms(10**7) == 0


def test_slow_subscriber_conditions_from_toml_with_the_seed_defaults(tmp_path):
    path = tmp_path / "b.toml"
    path.write_text(
        'topic_scheme = "swiftmq"\n'
        '[[slow_subscriber_conditions]]\nname = "feed"\nmax_messages = 100\n'
        'persistence_mode = "non_persistent"\nsubscription_type = "local"\n'
        '[[slow_subscriber_conditions]]\nname = "events"\nmax_messages = 300\n'
        'persistence_mode = "all"\nsubscription_type = "remote"\ndisconnect_non_durable_subscriber = true\n'
        '[[slow_subscriber_conditions]]\nname = "quotes"\n'
    )
    feed, events, quotes = load_settings(path).slow_subscriber_conditions
    assert (feed.name, feed.max_messages, feed.subscription_type) == ("feed", 100, "local")
    assert (events.persistence_mode, events.disconnect_non_durable_subscriber) == ("all", True)
    assert events.disconnect_delete_durable_subscriber is False
    # the seed's defaults: max-messages 500, non_persistent, all, no disconnect
    assert (quotes.max_messages, quotes.persistence_mode, quotes.subscription_type) == (
        500,
        "non_persistent",
        "all",
    )
    assert not quotes.disconnect_non_durable_subscriber and not quotes.disconnect_delete_durable_subscriber


def test_slow_subscriber_conditions_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BROKER_SLOW_SUBSCRIBER_CONDITIONS", '[{"name": "feed", "max_messages": 7}]')
    (condition,) = load_settings().slow_subscriber_conditions
    assert (condition.name, condition.max_messages) == ("feed", 7)


@pytest.mark.parametrize(
    ("mode", "kind", "persistent", "applies"),
    [
        ("non_persistent", "all", False, True),
        ("non_persistent", "local", True, False),
        ("persistent", "all", True, True),
        ("persistent", "local", False, False),
        ("all", "local", True, True),
        ("all", "all", False, True),
        ("all", "remote", True, False),  # no remote subscription exists yet
    ],
)
def test_a_condition_applies_by_delivery_mode_and_never_to_remote_subscriptions(
    mode, kind, persistent, applies
):
    from broker.core.config import SlowSubscriberCondition

    condition = SlowSubscriberCondition(name="feed", persistence_mode=mode, subscription_type=kind)
    assert condition.applies(persistent) is applies
