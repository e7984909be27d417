"""TLS (``rediss://``): every client the broker makes takes the ``tls_*`` settings.

The servers are ``scripts.rig.tls.TLSServer``: a binary built with TLS (the embedded
valkey-server is not; Debian's redis-server, which ``.ci/run`` installs, is), certificates
from trustme. Each server keeps a plain port for the fixtures (``Server.url``); the broker
is only ever given the TLS one (``tls_url``). ``tls_server`` does not ask for client
certificates; ``mtls_server`` requires one (``tls-auth-clients yes``, mutual TLS).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result
from rq import Queue, SimpleWorker

from broker import Publisher, Subscriber, cli, subscribe
from broker.core import keys
from broker.core.config import Settings
from broker.core.connection import TLSOptions, connect, wait_for_server
from broker.core.errors import ConfigError, ConnectionLost, ServerNotFound
from broker.core.server import cli_binary, cli_command
from broker.jobs import ADMIN_QUEUE, schedule
from broker.network.channel import ChannelProcess
from broker.network.network_admin import apply_network, list_proxies
from broker.testing import drain, make_workers, queue_messages, wait_for
from broker.topics.topology import parse_network
from scripts.rig.tls import Certificates, TLSCluster, TLSServer, make_certificates, tls_binary
from worker.pool import Pool

QM = "TLS"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def binary() -> str:
    found = tls_binary()
    if found is None:
        pytest.skip(
            "no server binary built with TLS: the embedded valkey-server has none, and there is no "
            "redis-server on PATH (Debian: apt-get install redis-server, as .ci/run does)"
        )
    return found


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_server(pki: Certificates, binary: str) -> Iterator[TLSServer]:
    server = TLSServer(pki, binary).start()
    assert isinstance(server, TLSServer)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mtls_server(pki: Certificates, binary: str) -> Iterator[TLSServer]:
    server = TLSServer(pki, binary, auth_clients="yes").start()
    assert isinstance(server, TLSServer)
    yield server
    server.stop()


@pytest.fixture
def plain(tls_server: TLSServer, mtls_server: TLSServer) -> Iterator[redis.Redis]:
    """The TLS server through its plain port (emptied before and after), for looking only."""
    clients = [redis.Redis(port=tls_server.port), redis.Redis(port=mtls_server.port)]
    for client in clients:
        client.flushall()
    yield clients[0]
    for client in clients:
        client.flushall()
        client.close()


def tls_env(pki: Certificates, mutual: bool = False, ca: str | None = None) -> dict[str, str]:
    """``BROKER_TLS_*`` variables: the CA (or ``ca``), and the client certificate when ``mutual``."""
    env = {"BROKER_TLS_CA_FILE": pki.ca if ca is None else ca}
    if mutual:
        env.update(BROKER_TLS_CERT_FILE=pki.client_cert, BROKER_TLS_KEY_FILE=pki.client_key)
    return env


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``broker --redis-url <url> --qm TLS ...`` through click, with only the ``BROKER_*`` variables given."""
    monkeypatch.chdir(tmp_path)  # no configs/broker.toml

    def invoke(url: str, env: dict[str, str], *args: str) -> Result:
        cleared: dict[str, str | None] = {
            k: None for k in os.environ if k.startswith("BROKER_") and k != "BROKER_REDIS_SERVER_BIN"
        }
        runner = CliRunner(env={**cleared, **env})
        return runner.invoke(cli.main, ["--redis-url", url, "--qm", QM, *args])

    return invoke


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.output, result.exc_info)
    return result


def failed(result: Result, code: int) -> str:
    """The one error line of a command that exited with ``code`` (no traceback)."""
    assert result.exit_code == code, (result.output, result.exc_info)
    assert "Traceback" not in result.output
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("error: ")
    return line


_wait_for = wait_for

# --- end to end ---------------------------------------------------------------------------------


def test_a_worker_pool_a_publisher_and_a_subscriber_deliver_over_tls(tls_server, pki, plain):
    # Given settings that name only the TLS port, with the test CA
    settings = Settings(redis_url=tls_server.tls_url, qm=QM, concurrency=1, tls_ca_file=pki.ca)
    client = connect(settings.redis_url, check=True, tls=settings.tls)
    record = subscribe(client, QM, "/orders/#", "app", "eu")
    pool = Pool(settings)  # its worker process connects with the settings it is given
    pool.start()
    try:
        _wait_for(lambda: plain.hlen(keys.workers(QM)) == 1, 60, "the worker over TLS")
        # When a publisher waits for its result, and the subscriber receives
        result = Publisher(client, QM, "p1").publish("/orders/eu", b"over tls", wait=True, timeout_ms=30_000)
        subscriber = Subscriber(client, QM, record, settings)
        delivery = subscriber.receive(timeout_ms=5_000)
        assert delivery is not None
        subscriber.ack(delivery)
        subscriber.close()
    finally:
        pool.stop()
    # Then the worker delivered it to the one subscription, and it arrived as published
    assert result.ok and result.subscriptions == 1
    assert (delivery.message.topic, delivery.message.body) == ("/orders/eu", b"over tls")
    client.close()


def test_the_command_line_takes_the_tls_settings_from_the_environment(tls_server, pki, plain, run):
    url, env = tls_server.tls_url, tls_env(pki)
    # Given a durable subscription and a publication, both made by the command line over TLS
    ok(run(url, env, "subscribe", "/orders/#", "--client-id", "app", "--durable", "d", "--timeout-ms", "1"))
    sent = ok(run(url, env, "publish", "/orders/eu", "hello", "--no-wait"))
    assert "sent" in sent.stdout
    assert plain.xlen(keys.publish_stream(QM)) == 1
    # When a worker (in-process, over TLS) delivers it
    client = connect(url, tls=TLSOptions(ca_file=pki.ca))
    assert drain(make_workers(client, Settings(redis_url=url, qm=QM, tls_ca_file=pki.ca), 1)) == 1
    # Then status and subscribe see it over TLS
    status = ok(run(url, env, "status"))
    assert f"queue manager {QM} on {url}" in status.stdout
    got = ok(run(url, env, "subscribe", "/orders/#", "--client-id", "app", "--durable", "d", "--count", "1"))
    assert "/orders/eu" in got.stdout and "hello" in got.stdout
    client.close()


def test_a_network_of_two_tls_servers_forwards_through_its_channel(tls_server, mtls_server, pki, plain):
    # Given A on one TLS server and B on another that requires client certificates: the
    # channel's peers reach B with the same TLS settings
    tls = pki.client(mutual=True)
    urls = {"A": tls_server.tls_url, "B": mtls_server.tls_url}
    settings = {
        qm: Settings(
            redis_url=url,
            qm=qm,
            tls_ca_file=tls.ca_file,
            tls_cert_file=tls.cert_file,
            tls_key_file=tls.key_file,
            sweep_interval_ms=1,
        )
        for qm, url in urls.items()
    }
    clients = {qm: connect(url, tls=tls) for qm, url in urls.items()}
    network = parse_network(
        {"queue_managers": {"A": {"url": urls["A"]}, "B": {"url": urls["B"], "parent": "A"}}}
    )
    assert not apply_network(network, urls["A"], clients["A"], tls).failed
    sub_id = subscribe(clients["B"], "B", "flights/#", "app", "fed").sub_id
    processes = {qm: ChannelProcess(clients[qm], settings[qm], name=f"ch-{qm}") for qm in urls}
    for process in processes.values():
        process.rejoin()
    processes["B"].agent.round()
    processes["A"].agent.round()
    assert [p.qm for p in list_proxies(clients["A"], "A")[0]] == ["B"]
    # When A publishes, its workers forward, its channel moves the entry to B, B's workers deliver
    Publisher(clients["A"], "A", "p1").publish("flights/JFK", b"to B")
    assert drain(make_workers(clients["A"], settings["A"], 1)) == 1
    assert processes["A"].run_once() == 1
    assert drain(make_workers(clients["B"], settings["B"], 1)) == 1
    # Then B's subscriber has it, from A
    [message] = queue_messages(clients["B"], "B", sub_id)
    assert (message.body, message.origin) == (b"to B", "A")
    for process in processes.values():
        process.close()
    for client in clients.values():
        client.close()


def test_the_scheduler_and_its_rq_jobs_connect_with_the_tls_settings(tls_server, pki, plain):
    # Given the periodic admin jobs scheduled over TLS
    url, tls = tls_server.tls_url, pki.client()
    assert len(schedule(url, QM, 60_000, tls=tls)) == 2
    assert schedule(url, QM, 60_000, tls=tls) == []  # the same settings: the same chains
    client = connect(url, tls=tls)
    queue = Queue(ADMIN_QUEUE, connection=client)
    # When an rq worker runs them (each job connects on its own, with the settings it carries)
    SimpleWorker([queue], connection=client).work(burst=True)
    # Then they ran over TLS, and their next runs carry the settings on
    assert plain.xlen(keys.usage(QM)) == 1
    following = [queue.fetch_job(i) for i in queue.scheduled_job_registry.get_job_ids()]
    assert len(following) == 2
    assert all(
        job.kwargs == {"tls": {"ca_file": pki.ca, "cert_file": "", "key_file": "", "verify": True}}
        for job in following
    )
    # and other TLS settings replace the chains
    assert len(schedule(url, QM, 60_000, tls=TLSOptions(ca_file=pki.ca, verify=False))) == 2
    client.close()


def test_a_redis_cluster_over_tls_delivers_and_names_a_wrong_ca(pki, binary):
    # Given a 3-master cluster whose masters announce their TLS ports
    cluster = TLSCluster(pki, binary).start()
    try:
        settings = Settings(redis_url=cluster.tls_url, qm=QM, tls_ca_file=pki.ca, sweep_interval_ms=1)
        client = connect(settings.redis_url, check=True, tls=settings.tls)
        record = subscribe(client, QM, "/orders/#", "app", "eu")
        # When a publication is published, delivered by a worker and received, all over TLS
        Publisher(client, QM, "p1").publish("/orders/eu", b"cluster tls")
        assert drain(make_workers(client, settings, 1)) == 1
        subscriber = Subscriber(client, QM, record, settings)
        delivery = subscriber.receive(timeout_ms=5_000)
        assert delivery is not None and delivery.message.body == b"cluster tls"
        subscriber.ack(delivery)
        subscriber.close()
        client.close()
        # And a wrong CA is named as for one server
        with pytest.raises(
            ConnectionLost, match=r"cannot reach the Redis Cluster at rediss.cluster://"
        ) as caught:
            connect(cluster.tls_url, check=True, tls=TLSOptions(ca_file=pki.other_ca))
        assert "set tls_ca_file" in str(caught.value)
    finally:
        cluster.stop()


# --- failures ------------------------------------------------------------------------------------


def test_a_wrong_ca_fails_in_one_line_with_exit_4_and_the_setting_to_change(tls_server, pki, plain, run):
    url = tls_server.tls_url
    secret = url.replace("rediss://", "rediss://default:s3cr3t@")
    for env in (tls_env(pki, ca=pki.other_ca), {}):  # a CA that did not sign it; the system's CAs
        line = failed(run(secret, env, "status"), 4)
        assert line.startswith(f"error: cannot reach Redis at {url.replace('://', '://default:***@')}: ")
        assert "CERTIFICATE_VERIFY_FAILED" in line and "s3cr3t" not in line
        assert "set tls_ca_file (BROKER_TLS_CA_FILE) to the CA that signed it" in line
    # A long-running process waiting for its server fails at once: waiting mends no certificate
    started = time.monotonic()
    line = failed(run(url, tls_env(pki, ca=pki.other_ca), "worker", "--wait-ms", "60000"), 4)
    assert time.monotonic() - started < 20
    assert "set tls_ca_file" in line
    with pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED"):
        wait_for_server(url, 60_000, tls=TLSOptions(ca_file=pki.other_ca))
    # tls_verify = false connects anyway (tests only)
    ok(run(url, {"BROKER_TLS_VERIFY": "false"}, "status"))


def test_a_plain_url_with_tls_settings_or_a_missing_file_is_a_config_error(tls_server, pki, plain, run):
    plain_url = tls_server.url
    line = failed(run(plain_url, tls_env(pki), "status"), 2)
    assert "TLS settings (tls_ca_file) are given" in line and "is not a TLS URL: use rediss://" in line
    missing = str(Path(pki.ca).with_name("nowhere.pem"))
    line = failed(run(tls_server.tls_url, tls_env(pki, ca=missing), "status"), 2)
    assert f"tls_ca_file {missing!r}: no such file" in line
    line = failed(
        run(tls_server.tls_url, {**tls_env(pki), "BROKER_TLS_KEY_FILE": pki.client_key}, "status"), 2
    )
    assert "tls_key_file" in line and "tls_cert_file is not" in line
    # the same checks in connect, for a caller that builds its own TLSOptions
    with pytest.raises(ConfigError, match="is not a TLS URL"):
        connect(plain_url, tls=TLSOptions(ca_file=pki.ca))
    with pytest.raises(ConfigError, match="no such file"):
        connect(tls_server.tls_url, tls=TLSOptions(ca_file=missing))
    # a plain URL to the TLS port names the fix
    line = failed(run(f"redis://127.0.0.1:{tls_server.tls_port}/0", {}, "status"), 4)
    assert "use a rediss:// URL" in line


def test_mutual_tls_works_with_the_client_certificate_and_fails_clearly_without(mtls_server, pki, plain, run):
    url = mtls_server.tls_url
    ok(run(url, tls_env(pki, mutual=True), "status"))
    ok(run(url, {**tls_env(pki), "BROKER_TLS_CERT_FILE": pki.client_pem}, "status"))  # key in the same file
    # Without a client certificate: exit 4, and the settings to give
    line = failed(run(url, tls_env(pki), "status"), 4)
    assert "set tls_cert_file and tls_key_file" in line
    with pytest.raises(ConnectionLost, match="tls-auth-clients"):
        connect(url, check=True, tls=pki.client())
    # With a certificate of a CA the server does not trust
    line = failed(run(url, {**tls_env(pki), "BROKER_TLS_CERT_FILE": pki.stranger_pem}, "status"), 4)
    assert (
        "the client certificate (tls_cert_file), which must be signed by a CA the server trusts" in line
        or ("the server refused the client certificate (tls_cert_file)" in line)
    )


# --- broker cli ----------------------------------------------------------------------------------


def test_broker_cli_passes_the_tls_settings_to_a_cli_built_with_tls(
    tls_server, mtls_server, pki, plain, tmp_path
):
    # The command line: --tls, the CA, the client certificate and key (the certificate again
    # when it holds the key), --insecure without verification
    try:
        tls_cli = cli_binary(tls=True)
    except ServerNotFound as exc:
        pytest.skip(f"no valkey-cli/redis-cli built with TLS: {exc}")
    argv, _ = cli_command("rediss://127.0.0.1:6390/0", ("PING",), pki.client(mutual=True))
    assert argv == [
        tls_cli,
        "-h",
        "127.0.0.1",
        "-p",
        "6390",
        "-n",
        "0",
        "--tls",
        "--cacert",
        pki.ca,
        "--cert",
        pki.client_cert,
        "--key",
        pki.client_key,
        "PING",
    ]
    argv, _ = cli_command("rediss://h:1", ["PING"], TLSOptions(cert_file=pki.client_pem, verify=False))
    assert argv[5:] == ["--tls", "--cert", pki.client_pem, "--key", pki.client_pem, "--insecure", "PING"]
    # `broker cli` over mutual TLS, the settings from the environment
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("BROKER_")},
        **tls_env(pki, mutual=True),
        "BROKER_REDIS_URL": mtls_server.tls_url,
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, "-c", "from broker.cli import main; main()", "cli", "SET", "k", "over-tls"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert redis.Redis(port=mtls_server.port).get("k") == b"over-tls"
