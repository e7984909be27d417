"""The command line against a real server: each command through click, workers run in-process."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner, Result

from broker import cli
from broker.core import keys
from broker.testing import drain, make_workers

QM = "TEST"


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.output, result.exc_info)
    return result


def test_link_then_links_lists_it_and_unlink_removes_it(run):
    linked = ok(run("link", "/WEATHER/JFK", "/AIRPORT/JFK"))
    assert linked.stdout.strip() == "linked /WEATHER/JFK -> /AIRPORT/JFK"
    listed = ok(run("links")).stdout
    assert "/WEATHER/JFK" in listed and "/AIRPORT/JFK" in listed
    ok(run("unlink", "/WEATHER/JFK", "/AIRPORT/JFK"))
    assert ok(run("links")).stdout.strip() == "no links"


def test_unlinking_a_missing_link_exits_2(run):
    result = run("unlink", "/A", "/B")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: there is no link '/A' -> '/B'")


def test_link_closing_a_cycle_is_refused_with_exit_2_but_accepted_as_backward(run):
    ok(run("link", "/A", "/B"))
    ok(run("link", "/B", "/C"))
    refused = run("link", "/C", "/A")
    assert refused.exit_code == 2
    assert "would close a cycle" in refused.stderr and "Traceback" not in refused.output
    assert ok(run("link", "--backward", "/C", "/A")).stdout.strip() == "linked /C -> /A (backward)"
    listed = ok(run("links")).stdout
    assert "yes" in listed  # the backward flag is shown


def test_durable_subscription_made_by_subscribe_is_listed_and_survives_exit(run):
    made = ok(run("subscribe", "/WEATHER/#", "--client-id", "app", "--durable", "wx", "--timeout-ms", "1"))
    assert "subscribed app$wx to '/WEATHER/#' (durable, exclusive)" in made.stderr
    listed = ok(run("subscriptions")).stdout
    assert "app$wx" in listed and "/WEATHER/#" in listed and "yes" in listed
    assert "/WEATHER/#" in ok(run("topics")).stdout


def test_non_durable_subscription_is_removed_when_subscribe_exits(run, real_redis):
    ok(run("subscribe", "/X", "--client-id", "tmp", "--timeout-ms", "1"))
    assert real_redis.hlen(keys.subscriptions(QM)) == 0
    assert ok(run("subscriptions")).stdout.strip() == "no subscriptions"


def test_unsubscribe_deletes_the_subscription_and_an_unknown_one_exits_2(run):
    ok(run("subscribe", "/X", "--client-id", "app", "--durable", "d", "--timeout-ms", "1"))
    assert ok(run("unsubscribe", "app$d")).stdout.strip() == "unsubscribed app$d"
    again = run("unsubscribe", "app$d")
    assert again.exit_code == 2
    assert "no subscription 'app$d'" in again.stderr


def test_topics_with_a_topic_shows_the_linked_topics_it_reaches(run):
    ok(run("subscribe", "/AIRPORT/+", "--client-id", "ops", "--durable", "airports", "--timeout-ms", "1"))
    ok(run("subscribe", "/WEATHER/JFK", "--client-id", "app", "--durable", "jfk", "--timeout-ms", "1"))
    ok(run("link", "/WEATHER/JFK", "/AIRPORT/JFK"))
    ok(run("link", "/AIRPORT/JFK", "/ALERTS/NYC"))
    out = ok(run("topics", "/WEATHER/JFK")).stdout
    for topic in ("/WEATHER/JFK", "/AIRPORT/JFK", "/ALERTS/NYC"):
        assert topic in out
    assert out.index("/AIRPORT/JFK") < out.index("/ALERTS/NYC")
    assert out.strip().splitlines()[-2:] == [
        "delivered once to 2 subscriptions: app$jfk, ops$airports",
        "rule: one copy per subscription (Jakarta Messaging)",
    ]


def test_topics_with_an_invalid_topic_exits_2_with_a_suggestion(run):
    result = run("topics", "/WEATHER/+")
    assert result.exit_code == 2
    assert "(did you mean '/WEATHER'?)" in result.stderr


def test_status_json_is_one_parseable_object(run):
    ok(run("subscribe", "/X", "--client-id", "app", "--durable", "d", "--timeout-ms", "1"))
    snapshot = json.loads(ok(run("status", "--json")).stdout)
    assert snapshot["dead_lettered"] == 0
    assert [s["id"] for s in snapshot["subscriptions"]] == ["app$d"]


def test_status_table_shows_queue_depths_and_workers(run, real_redis, settings):
    ok(run("subscribe", "/X", "--client-id", "app", "--durable", "d", "--timeout-ms", "1"))
    ok(run("publish", "--no-wait", "/X", "one"))
    drain(make_workers(real_redis, settings, 1))
    out = ok(run("status")).stdout
    assert "queue manager TEST" in out and "app$d" in out and "w0" in out


def test_message_published_without_waiting_is_printed_by_subscribe_after_a_worker_ran(
    run, real_redis, settings
):
    ok(run("subscribe", "/WEATHER/#", "--client-id", "app", "--durable", "inbox", "--timeout-ms", "1"))
    sent = ok(run("publish", "--no-wait", "--publisher", "station", "/WEATHER/JFK", "rain at 5"))
    assert sent.stdout.startswith("sent (entry ")
    assert drain(make_workers(real_redis, settings, 1)) == 1
    got = ok(
        run(
            "subscribe",
            "/WEATHER/#",
            "--client-id",
            "app",
            "--durable",
            "inbox",
            "--count",
            "1",
            "--timeout-ms",
            "1000",
        )
    )
    assert got.stdout.strip() == "/WEATHER/JFK  publisher=station  seq=1  priority=4  rain at 5"
    assert "received 1 message(s)" in got.stderr
    assert real_redis.llen(keys.sub_inflight(QM, "app$inbox")) == 0  # acknowledged


def test_binary_body_from_a_file_is_printed_as_a_bytes_literal(run, real_redis, settings, tmp_path):
    ok(run("subscribe", "/BIN", "--client-id", "app", "--durable", "bin", "--timeout-ms", "1"))
    body = tmp_path / "body.bin"
    body.write_bytes(b"\x00\xff")
    ok(run("publish", "--no-wait", "--body-file", str(body), "/BIN"))
    drain(make_workers(real_redis, settings, 1))
    got = ok(
        run(
            "subscribe",
            "/BIN",
            "--client-id",
            "app",
            "--durable",
            "bin",
            "--count",
            "1",
            "--timeout-ms",
            "1000",
        )
    )
    assert got.stdout.strip().endswith("b'\\x00\\xff'")


def test_subscribe_stops_after_count_messages_leaving_the_rest_queued(run, real_redis, settings):
    ok(run("subscribe", "/Q", "--client-id", "app", "--durable", "q", "--timeout-ms", "1"))
    for body in ("a", "b", "c"):
        ok(run("publish", "--no-wait", "/Q", body))
    drain(make_workers(real_redis, settings, 1))
    got = ok(
        run("subscribe", "/Q", "--client-id", "app", "--durable", "q", "--count", "2", "--timeout-ms", "1000")
    )
    assert [line.split()[-1] for line in got.stdout.splitlines()] == ["a", "b"]
    assert real_redis.llen(keys.sub_queue(QM, "app$q")) == 1


def test_unvalidated_invalid_topic_is_refused_by_the_broker_and_dead_lettered(run, real_redis, settings):
    sent = ok(run("publish", "--no-wait", "--no-validate", "/a/#", "bad"))
    assert sent.stdout.startswith("sent ")
    assert drain(make_workers(real_redis, settings, 1)) == 1
    snapshot = json.loads(ok(run("status", "--json")).stdout)
    assert snapshot["dead_lettered"] == 1
    [(_, fields)] = real_redis.xrange(keys.dead_letter(QM))
    assert fields[b"topic"] == b"/a/#"


def test_publish_waiting_with_no_worker_times_out_with_exit_3(run):
    result = run("publish", "--timeout-ms", "50", "/X", "x")
    assert result.exit_code == 3
    assert result.stderr.startswith("error: no result for message") and "within 50 ms" in result.stderr


def test_a_password_in_the_redis_url_is_never_printed(real_server, tmp_path, monkeypatch):
    # Given a URL with a password (the test server's default user accepts any: nopass)
    monkeypatch.chdir(tmp_path)
    env = {k: None for k in os.environ if k.startswith("BROKER_") and k != "BROKER_REDIS_SERVER_BIN"}
    runner = CliRunner(env=env)
    url = real_server.url.replace("redis://", "redis://default:s3cr3t@")
    # When status runs against it, and an error names an unreachable server
    shown = runner.invoke(cli.main, ["--redis-url", url, "--qm", QM, "status"])
    failed = runner.invoke(cli.main, ["--redis-url", "redis://u:s3cr3t@127.0.0.1:1/0", "--qm", QM, "status"])
    # Then the password appears nowhere, the redacted URL does
    assert shown.exit_code == 0, shown.output
    assert failed.exit_code == 4
    for result in (shown, failed):
        assert "s3cr3t" not in result.output
        assert ":***@" in result.output


def test_broker_server_started_outside_the_repo_runs_with_the_packaged_config(tmp_path, monkeypatch):
    # Given a directory with no configs/ in it (an operator's home, a container's /)
    import signal
    import subprocess
    import sys
    import time

    import redis

    from broker.core.server import free_port

    monkeypatch.chdir(tmp_path)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    from pathlib import Path

    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "broker"),
            "server",
            "--port",
            str(port),
            "--dir",
            str(tmp_path / "data"),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    try:
        # When it is up
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
        # Then it runs with AOF and noeviction, as the packaged redis.conf says
        assert client.config_get("appendonly")["appendonly"] in ("yes", b"yes")
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] in ("noeviction", b"noeviction")
        assert int(client.config_get("maxmemory")["maxmemory"]) == 1024**3  # maxmemory 1gb
    finally:
        client.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0


@pytest.mark.parametrize("durable", [False, True])
def test_broker_subscribe_closes_orderly_on_sigterm_and_exits_0(real_server, real_redis, tmp_path, durable):
    # Given broker subscribe running in its own process, attached to its subscription
    import signal
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    durable_args = ["--durable", "keep"] if durable else []
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker",
            "--redis-url",
            real_server.url,
            "--qm",
            QM,
            "subscribe",
            "/t",
            "--client-id",
            "app",
            *durable_args,
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # printed once attached: its lease is in the consumers zset
        assert line.startswith("subscribed "), line
        sub_id = line.split()[1]
        assert real_redis.hexists(keys.subscriptions(QM), sub_id)
        assert real_redis.zcard(keys.sub_consumers(QM, sub_id)) == 1
        # When it is sent SIGTERM (as systemd, Docker or Kubernetes stop a process)
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        assert proc.wait(timeout=30) == 0, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Then it closed orderly: its consumer left at once, and a non-durable subscription is gone
    assert "received 0 message(s)" in rest
    assert real_redis.zcard(keys.sub_consumers(QM, sub_id)) == 0
    assert real_redis.hexists(keys.subscriptions(QM), sub_id) == durable


def test_broker_cli_runs_the_shipped_valkey_cli_against_the_configured_server(real_server, tmp_path):
    # Given the configured server (with a password in the URL: the default user accepts any)
    import subprocess
    import sys
    from pathlib import Path

    url = real_server.url.replace("redis://", "redis://default:s3cr3t@")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("BROKER_")},
        "BROKER_REDIS_URL": url,
        "BROKER_QM": QM,
    }
    broker_bin = str(Path(sys.executable).parent / "broker")
    # When a raw XADD and an XLEN go through `broker cli`
    added = subprocess.run(
        [
            broker_bin,
            "cli",
            "XADD",
            keys.publish_stream(QM),
            "*",
            "publisher",
            "svc-7",
            "topic",
            "/ORDERS/EU",
            "body",
            "hello",
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    length = subprocess.run(
        [broker_bin, "cli", "XLEN", keys.publish_stream(QM)],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    # Then they reached the server, and the password was not on the command line's output
    assert added.returncode == 0, added.stderr
    assert length.stdout.strip() == "1"
    assert "s3cr3t" not in added.stdout + added.stderr


def test_cli_command_line_takes_host_port_db_user_and_password_from_the_url():
    from broker.core.server import cli_command

    argv, env = cli_command("redis://app:p%40ss@10.0.0.5:6380/2", ("PING",))
    assert argv[1:] == ["-h", "10.0.0.5", "-p", "6380", "-n", "2", "--user", "app", "PING"]
    assert env == {"REDISCLI_AUTH": "p@ss"}


def test_subscribe_with_selector_no_local_and_shared_shows_them_and_browse_does_not_consume(
    run, real_redis, settings
):
    made = ok(
        run(
            "subscribe",
            "/orders/#",
            "--client-id",
            "app",
            "--durable",
            "eu",
            "--selector",
            "region = 'eu' AND amount > 50",
            "--no-local",
            "--timeout-ms",
            "1",
        )
    )
    assert "selector \"region = 'eu' AND amount > 50\", no-local, exclusive" in made.stderr
    shared = ok(
        run("subscribe", "$share/grp/+/orders/+", "--client-id", "w1", "--durable", "s", "--timeout-ms", "1")
    )
    assert "subscribed grp$s to '$share/grp/+/orders/+' (durable, shared)" in shared.stderr
    # typed properties (KEY:=JSON) meet the selector's numeric comparison; a string does not;
    # no-local skips the subscriber's own client id
    for args in (
        ("/orders/1", "big", "-p", "region=eu", "-p", "amount:=99"),
        ("/orders/2", "str", "-p", "region=eu", "-p", "amount=99"),
        ("/orders/3", "mine", "--client-id", "app", "-p", "region=eu", "-p", "amount:=99"),
    ):
        ok(run("publish", *args, "--no-wait"))
    drain(make_workers(real_redis, settings, 1))
    assert real_redis.llen(keys.sub_queue(QM, "grp$s")) == 3
    listed = ok(run("subscriptions")).stdout
    row = next(line for line in listed.splitlines() if "app$eu" in line)
    assert "region = 'eu' AND amount > 50" in row and "yes" in row and "exclusive" in row
    assert "$share/grp/+/orders/+" in listed and "shared" in listed
    browsed = ok(run("browse", "app$eu"))
    assert browsed.stdout.splitlines() == ["/orders/1  publisher=cli  seq=1  priority=4  big"]
    assert ok(run("browse", "app$eu")).stdout == browsed.stdout  # nothing was taken
    assert run("browse", "app$nope").exit_code == 2


def test_invalid_selector_is_refused_with_its_position_and_nothing_is_made(run, real_redis):
    result = run(
        "subscribe", "/a", "--client-id", "app", "--durable", "x", "--selector", "a = ", "--timeout-ms", "1"
    )
    assert result.exit_code == 2
    assert "invalid selector 'a = ' at position 4" in result.stderr
    assert real_redis.hlen(keys.subscriptions(QM)) == 0


def test_a_second_exclusive_consumer_from_the_cli_is_refused(run, real_redis, settings):
    from broker import Subscriber, subscribe

    record = subscribe(real_redis, QM, "/a", "app", "one")
    holder = Subscriber(real_redis, QM, record, settings, heartbeat=False)
    result = run("subscribe", "/a", "--client-id", "app", "--durable", "one", "--timeout-ms", "1")
    assert result.exit_code == 3 and "is exclusive" in result.stderr
    holder.close()


def test_waiting_for_a_result_longer_than_the_socket_timeout_is_a_reply_timeout(real_server, real_redis):
    # redis-py's default socket timeout (5 s) must not turn a long wait into a "lost connection"
    import redis as redis_py

    from broker import Publisher, ReplyTimeout

    client = redis_py.Redis.from_url(real_server.url, socket_timeout=0.5)
    with pytest.raises(ReplyTimeout):
        Publisher(client, QM, "p").publish("/a", b"x", wait=True, timeout_ms=1_500)


def test_topic_objects_from_the_cli_define_display_status_tree_apply_and_refuse(
    run, real_redis, settings, tmp_path
):
    assert (
        "defined topic object PAY"
        in ok(run("topic", "define", "PAY", "--topic-string", "/PAY", "--pub", "disabled")).stdout
    )
    ok(run("topic", "define", "SPORT", "--topic-string", "/SPORT", "--defprty", "7", "--wildcard", "BLOCK"))
    bad = run("topic", "define", "X", "--topic-string", "/x", "--defprty", "12")
    assert bad.exit_code == 2 and "DEFPRTY must be 0-9" in bad.output
    again = run("topic", "define", "PAY", "--topic-string", "/ELSEWHERE", "--replace")
    assert again.exit_code == 2 and "cannot be changed" in again.stderr
    assert "PAY" in ok(run("topic", "display", "P*")).stdout
    assert run("topic", "delete", "SYSTEM.BASE.TOPIC").exit_code == 2
    # publishing under a disabled node is refused with the object named (exit 3)
    ok(run("publish", "/PAY/EU", "x", "--no-wait"))
    ok(run("subscribe", "#", "--client-id", "ops", "--durable", "all", "--timeout-ms", "1"))
    ok(run("publish", "--topic-object", "SPORT", "TENNIS", "ace", "--no-wait"))
    drain(make_workers(real_redis, settings, 1))
    (dead,) = real_redis.xrange(keys.dead_letter(QM))
    assert b"topic object 'PAY' has PUB(DISABLED)" in dead[1][b"dlq.reason"]
    status = ok(run("topic", "status", "/SPORT/TENNIS")).stdout
    assert (
        "DEFPRTY" in status
        and "SPORT" in status
        and "blocked by WILDCARD(BLOCK) of topic object SPORT: ops$all" in status
    )
    assert "publishers in the newest" in status and "cli (1)" in status
    tree = ok(run("topic", "tree")).stdout
    assert "SYSTEM.BASE.TOPIC" in tree and "[SPORT]" in tree and "1 subscription" in tree
    # subscriptions under SUB(DISABLED) are refused (exit 3)
    ok(run("topic", "alter", "PAY", "--sub", "disabled"))
    no = run("subscribe", "/PAY/#", "--client-id", "c", "--timeout-ms", "1")
    assert no.exit_code == 3 and "SUB(DISABLED)" in no.stderr
    # apply a file twice: the second time changes nothing
    path = tmp_path / "topics.toml"
    path.write_text('[[topic]]\nname = "NEWS"\ntopic_string = "/NEWS"\nmaxdepth = 5\n')
    assert "defined: 1 (NEWS)" in ok(run("topic", "apply", str(path))).stdout
    assert "unchanged: 1 (NEWS)" in ok(run("topic", "apply", str(path))).stdout


# --- usage lists (durables, subscribers) and Delete Durable -----------------------------------------


def test_durables_lists_each_durable_with_its_client_id_queue_and_depth_and_no_non_durable(run, real_redis):
    from broker import subscribe

    subscribe(real_redis, QM, "/orders/#", "sales", "eu", selector="region = 'eu'", no_local=True)
    subscribe(real_redis, QM, "/x", "app", None)  # non-durable
    real_redis.lpush(keys.sub_band(QM, "sales$eu", 7), b"m1")
    real_redis.lpush(keys.sub_queue(QM, "sales$eu"), b"m2")
    out = ok(run("durables")).stdout
    (row,) = [line for line in out.splitlines() if "sales$eu" in line]
    for cell in ("sales", "eu", "/orders/#", "region = 'eu'", "yes", "{TEST}:sub:sales$eu", "2"):
        assert cell in row
    assert "app$" not in out
    data = json.loads(ok(run("durables", "--json")).stdout)
    assert data["problems"] == []
    assert data["rows"] == [
        {
            "name": "sales$eu",
            "client_id": "sales",
            "durable_name": "eu",
            "topic": "/orders/#",
            "selector": "region = 'eu'",
            "no_local": True,
            "bound_to": "{TEST}:sub:sales$eu",
            "durable": True,
            "consumers": 0,
            "depth": 2,
        }
    ]


def test_subscribers_lists_only_subscriptions_with_a_live_consumer_durable_or_not(run, real_redis, settings):
    from broker import Subscriber, subscribe

    idle = subscribe(real_redis, QM, "/a", "app", "idle")
    busy = subscribe(real_redis, QM, "/a", "app", "busy")
    temp = subscribe(real_redis, QM, "/b", "tmp", None)
    assert ok(run("subscribers")).stdout.strip() == "no active subscribers"
    consumers = [Subscriber(real_redis, QM, r, settings, heartbeat=False) for r in (busy, temp)]
    out = ok(run("subscribers")).stdout
    assert "app$busy" in out and temp.sub_id in out and idle.sub_id not in out
    (row,) = [line for line in out.splitlines() if "app$busy" in line]
    assert row.rstrip(" │|").endswith("1")  # one consumer
    rows = json.loads(ok(run("subscribers", "--json")).stdout)["rows"]
    assert [(r["name"], r["consumers"], r["durable"]) for r in rows] == [
        ("app$busy", 1, True),
        (temp.sub_id, 1, False),
    ]
    for consumer in consumers:
        consumer.close()


def test_a_durable_made_by_hand_with_valkey_cli_is_listed_by_durables(run, real_server):
    # Given a durable subscription a non-Python service made with plain commands
    import subprocess

    from broker.core.server import cli_binary

    record = '{"filter":"/ORDERS/+","durable":true,"created_ms":0,"selector":"amount > 5"}'
    for args in (("HSET", keys.subscriptions(QM), "svc$orders", record), ("INCR", keys.version(QM))):
        subprocess.run([cli_binary(), "-p", str(real_server.port), *args], check=True, capture_output=True)
    subprocess.run(
        [cli_binary(), "-p", str(real_server.port), "LPUSH", keys.sub_queue(QM, "svc$orders"), "m"],
        check=True,
        capture_output=True,
    )
    # When the operator lists durables, Then it is there with its filter, selector, queue and depth
    (row,) = json.loads(ok(run("durables", "--json")).stdout)["rows"]
    assert (row["name"], row["client_id"], row["durable_name"], row["topic"]) == (
        "svc$orders",
        "svc",
        "orders",
        "/ORDERS/+",
    )
    assert row["selector"] == "amount > 5" and row["depth"] == 1
    assert "svc$orders" in ok(run("durables")).stdout


def test_durables_and_subscribers_name_a_corrupt_record_and_a_foreign_key_instead_of_failing(run, real_redis):
    from broker import subscribe

    subscribe(real_redis, QM, "/a", "app", "ok")
    subscribe(real_redis, QM, "/a", "app", "foreign")
    real_redis.hset(keys.subscriptions(QM), "app$bad", "{not json")
    real_redis.set(keys.sub_band(QM, "app$foreign", 9), "a string")
    listed = ok(run("durables"))
    assert "app$ok" in listed.stdout and "app$foreign" in listed.stdout
    assert "corrupt record 'app$bad'" in listed.stdout
    assert "foreign key: {TEST}:sub:app$foreign:p9 holds a string, not a list" in listed.stdout
    row = next(
        r for r in json.loads(ok(run("durables", "--json")).stdout)["rows"] if r["name"] == "app$foreign"
    )
    assert row["depth"] is None
    assert "corrupt record 'app$bad'" in ok(run("subscribers")).stdout
    # a foreign subscription hash: named, not a traceback
    real_redis.delete(keys.subscriptions(QM))
    real_redis.set(keys.subscriptions(QM), "x")
    whole = ok(run("durables"))
    assert "foreign key: {TEST}:subs holds a string, not a hash" in whole.stdout


def test_durables_delete_needs_both_predicates_lists_on_dry_run_and_deletes(run, real_redis):
    from broker import subscribe

    for client_id in ("sales", "salesx"):
        subscribe(real_redis, QM, "/a", client_id, "d1")
    missing = run("durables", "delete", "--client-id", "sales")
    assert missing.exit_code == 2 and "--durable-name" in missing.output
    bad = run("durables", "delete", "--client-id", "sales\\", "--durable-name", "%")
    assert bad.exit_code == 2 and "escape character" in bad.stderr
    dry = ok(run("durables", "delete", "--client-id", "sales", "--durable-name", "%", "--dry-run"))
    assert "sales$d1" in dry.stdout and "messages held" in dry.stdout
    assert dry.stdout.strip().endswith("would delete 1 durable subscription (0 message(s))")
    assert real_redis.hlen(keys.subscriptions(QM)) == 2
    done = ok(run("durables", "delete", "--client-id", "sales", "--durable-name", "%"))
    assert done.stdout.strip().endswith("deleted 1 durable subscription (0 message(s))")
    assert real_redis.hkeys(keys.subscriptions(QM)) == [b"salesx$d1"]


def test_jobs_schedule_list_and_cancel_from_the_cli(run, real_redis):
    bad = run(
        "jobs", "schedule", "delete-durable", "--cron", "0 3 * *", "--client-id", "s", "--durable-name", "%"
    )
    assert bad.exit_code == 2 and "must have 5 fields" in bad.stderr
    assert real_redis.exists(keys.schedules(QM)) == 0
    made = ok(
        run(
            "jobs",
            "schedule",
            "delete-durable",
            "--cron",
            "0 3 * * *",
            "--client-id",
            "sales",
            "--durable-name",
            "%",
        )
    )
    assert made.stdout.startswith("scheduled delete-durable-") and "next run 20" in made.stdout
    schedule_id = made.stdout.split()[1].rstrip(":")
    listed = ok(run("jobs", "list")).stdout
    (row,) = [line for line in listed.splitlines() if schedule_id in line]
    assert "delete-durable" in row and "client_id=sales durable_name=%" in row and "0 3 * * *" in row
    assert "03:00:00 UTC" in row
    [entry] = json.loads(ok(run("jobs", "list", "--json")).stdout)["schedules"]
    assert entry["id"] == schedule_id and entry["params"] == {"client_id": "sales", "durable_name": "%"}
    assert ok(run("jobs", "cancel", schedule_id)).stdout.strip() == f"cancelled {schedule_id}"
    assert ok(run("jobs", "list")).stdout.strip() == "no scheduled jobs"
    again = run("jobs", "cancel", schedule_id)
    assert again.exit_code == 2 and "no scheduled job" in again.stderr
