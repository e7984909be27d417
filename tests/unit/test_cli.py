"""The command line without a server: help, configuration errors, bad input, an unreachable Redis."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from broker import cli
from broker.clients.publish import Publisher, PublishResult

COMMANDS = [
    "worker",
    "server",
    "demo",
    "publish",
    "subscribe",
    "unsubscribe",
    "subscriptions",
    "link",
    "unlink",
    "links",
    "topics",
    "status",
    "pipeline",
    "journal",
    "scheduler",
]

CLOSED = "redis://127.0.0.1:1/0"


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Invoke ``broker`` in an empty directory with no BROKER_* variables set."""
    monkeypatch.chdir(tmp_path)
    env = {k: None for k in os.environ if k.startswith("BROKER_") and k != "BROKER_REDIS_SERVER_BIN"}
    runner = CliRunner(env=env)

    def invoke(*args: str) -> Result:
        return runner.invoke(cli.main, list(args))

    return invoke


def assert_one_error_line(result: Result, exit_code: int) -> str:
    assert result.exit_code == exit_code, result.output
    assert isinstance(result.exception, SystemExit), result.exc_info
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_group_help_lists_every_command(run):
    result = run("--help")
    assert result.exit_code == 0
    for name in COMMANDS:
        assert f"  {name} " in result.output


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_has_its_own_help(run, name):
    result = run(name, "--help")
    assert result.exit_code == 0, result.output
    assert f"Usage: main {name}" in result.output or f"{name} [OPTIONS]" in result.output


def test_command_help_works_even_when_the_config_file_is_broken(run, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("qm = = 1\n")
    result = run("--config", str(bad), "status", "--help")
    assert result.exit_code == 0
    assert "Usage:" in result.output


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("qm = = 'x'\n", "is not valid TOML"),
        ("no_such_setting = 1\n", "unknown setting(s) no_such_setting"),
        ('concurrency = "many"\n', "concurrency"),
    ],
    ids=["syntax-error", "unknown-key", "bad-value"],
)
def test_bad_config_file_gives_one_error_line_naming_the_file_and_exit_2(run, tmp_path, text, expected):
    path = tmp_path / "broker.toml"
    path.write_text(text)
    result = run("--config", str(path), "status")
    line = assert_one_error_line(result, 2)
    assert str(path) in line
    assert expected in line


def test_missing_config_file_gives_exit_2(run, tmp_path):
    result = run("--config", str(tmp_path / "nope.toml"), "links")
    line = assert_one_error_line(result, 2)
    assert "does not exist" in line


def test_config_file_is_taken_from_the_environment(run, tmp_path):
    path = tmp_path / "env.toml"
    path.write_text("bogus = 1\n")
    result = CliRunner(env={"BROKER_CONFIG": str(path)}).invoke(cli.main, ["status"])
    line = assert_one_error_line(result, 2)
    assert str(path) in line


def test_publish_on_a_wildcard_topic_exits_2_with_a_suggestion(run):
    result = run("--redis-url", CLOSED, "publish", "/a/#", "hello")
    line = assert_one_error_line(result, 2)
    assert "invalid topic '/a/#'" in line
    assert "(did you mean '/a'?)" in line


def test_refused_publication_prints_reason_and_suggestion_and_exits_3(run, monkeypatch):
    def refused(self, topic, body=b"", **options):
        return PublishResult("refused", "1-0", "m1", 1, reason="wildcards are not allowed", suggestion="/a")

    monkeypatch.setattr(Publisher, "publish", refused)
    result = run("--redis-url", CLOSED, "publish", "--no-validate", "/a/#", "hello")
    line = assert_one_error_line(result, 3)
    assert line == "error: publication refused: wildcards are not allowed (did you mean '/a'?)"


def test_delivered_publication_prints_how_many_subscriptions_got_it(run, monkeypatch):
    seen = {}

    def delivered(self, topic, body=b"", **options):
        seen.update(options, topic=topic, body=body, publisher=self.publisher_id)
        return PublishResult("delivered", "123-0", "m1", 1, subscriptions=3)

    monkeypatch.setattr(Publisher, "publish", delivered)
    result = run(
        "--redis-url", CLOSED, "publish", "/a/b", "hi", "-p", "k=v", "--priority", "7", "--non-persistent"
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "delivered to 3 subscriptions (entry 123-0)"
    assert seen["body"] == b"hi" and seen["publisher"] == "cli" and seen["wait"] is True
    assert seen["properties"] == {"k": "v"} and seen["priority"] == 7 and seen["persistent"] is False


def test_publish_rejects_a_property_without_equals_sign(run):
    result = run("--redis-url", CLOSED, "publish", "/a", "x", "--property", "novalue")
    assert result.exit_code == 2
    assert "KEY=VALUE" in result.output


def test_publish_rejects_both_body_and_body_file(run, tmp_path):
    body = tmp_path / "body.bin"
    body.write_bytes(b"x")
    result = run("--redis-url", CLOSED, "publish", "/a", "x", "--body-file", str(body))
    assert result.exit_code == 2
    assert "not both" in result.output


def test_status_against_a_closed_port_gives_one_line_and_exit_4(run):
    result = run("--redis-url", CLOSED, "status")
    line = assert_one_error_line(result, 4)
    assert line.startswith(f"error: cannot reach Redis at {CLOSED}")


def test_publish_against_a_closed_port_names_the_server_and_exits_4(run):
    result = run("--redis-url", CLOSED, "publish", "--no-wait", "/a", "x")
    line = assert_one_error_line(result, 4)
    assert f"cannot reach Redis at {CLOSED}" in line


def test_subscribe_with_a_bad_client_id_exits_2(run):
    result = run("--redis-url", CLOSED, "subscribe", "/a/#", "--client-id", "bad id")
    line = assert_one_error_line(result, 2)
    assert "client id 'bad id'" in line


def test_subscribe_with_an_invalid_filter_exits_2(run):
    result = run("--redis-url", CLOSED, "subscribe", "/a/#/b", "--client-id", "app")
    line = assert_one_error_line(result, 2)
    assert "invalid topic filter" in line


def test_bad_redis_url_scheme_is_a_config_error(run):
    result = run("--redis-url", "http://localhost", "links")
    line = assert_one_error_line(result, 2)
    assert "redis_url" in line


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (CLOSED + "?bogus=1", f"error: Redis URL {CLOSED}: unknown option 'bogus' in its query string"),
        (
            "redis://u:pw@127.0.0.1:1/0?password=pw2&bogus=1",
            "redis://u:***@127.0.0.1:1/0: unknown option 'bogus'",
        ),
        ("redis+cluster://127.0.0.1:1?bogus=1", "redis+cluster://127.0.0.1:1: unknown option 'bogus'"),
        ("unix:///tmp/no.sock?bogus=1", "unix:///tmp/no.sock: unknown option 'bogus'"),
        (CLOSED + "?socket_timeout=abc", "Invalid value for 'socket_timeout'"),
    ],
)
def test_a_redis_url_with_an_unknown_query_option_is_one_config_error_line_exit_2(run, url, expected):
    # Given a URL whose query string redis-py cannot use; When any command connects
    result = run("--redis-url", url, "status")
    # Then one line names the option and the URL (no password, no query string), exit 2 (a config error)
    line = assert_one_error_line(result, 2)
    assert expected in line and "pw" not in line


def test_known_redis_url_query_options_are_accepted():
    from broker.core.connection import connect

    client = connect(CLOSED + "?socket_timeout=3&client_name=me&health_check_interval=10")
    assert client.connection_pool.connection_kwargs["client_name"] == "me"


@pytest.mark.parametrize(
    ("body", "line"),
    [(b"plain text", "plain text"), (b"two\nlines", "b'two\\nlines'"), (b"\xff\xfe", "b'\\xff\\xfe'")],
)
def test_subscriber_prints_one_line_per_message_whatever_the_body(body, line):
    from broker.cli.render import _format_message
    from broker.core.models import Message

    text = _format_message(Message(msgid="m", publisher="p", topic="/t", timestamp_ms=0, body=body))
    assert "\n" not in text and text.endswith(line)


def test_subscriber_line_names_a_message_group_and_its_sequence_number():
    from broker.cli.render import _format_message
    from broker.core.models import Message

    def line(**props: object) -> str:
        return _format_message(
            Message(msgid="m", publisher="p", topic="/t", timestamp_ms=0, properties=props)
        )

    assert "  group=order-7#2  " in line(JMSXGroupID="order-7", JMSXGroupSeq=2)
    assert line(JMSXGroupID="order-7").endswith("  group=order-7  ")
    assert "group=" not in line(JMSXGroupID=7) and "group=" not in line(note="x")
