"""Settings: file, then environment, then overrides; bad input gives a clear ConfigError."""

from __future__ import annotations

import pytest

from broker.config import load_settings
from broker.errors import ConfigError


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
    from broker.connection import redact_url

    assert redact_url(url) == shown


def test_a_server_config_that_does_not_exist_is_a_clear_error_and_the_default_is_packaged():
    from pathlib import Path

    from broker.config import Settings, load_settings
    from broker.errors import ConfigError

    with pytest.raises(ConfigError, match="server_config: .*no such file"):
        load_settings(None, server_config="/nonexistent/redis.conf")
    packaged = Path(Settings().server_config_file())
    assert packaged.is_file() and "appendonly yes" in packaged.read_text()


def test_public_entry_points_raise_broker_errors_not_redis_py_errors():
    import redis

    from broker import ConnectionLost, Subscriber, explain, link, list_subscriptions, status, subscribe
    from broker.subscriptions import SubscriptionRecord

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
