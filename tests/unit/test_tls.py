"""The TLS settings without a server: checks, redis-py's arguments, the hints of a failure."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from broker.core.config import load_settings
from broker.core.connection import TLSOptions, is_tls_url, tls_hint, unreachable
from broker.core.errors import ConfigError
from broker.jobs import _carry, _stored
from scripts.rig.tls import make_certificates

URL = "rediss://127.0.0.1:6390/0"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("pki"))


def test_the_settings_give_redis_py_its_ssl_arguments(pki):
    assert TLSOptions().client_options(URL) == {}  # nothing set: redis-py's defaults
    assert TLSOptions().client_options("redis://h:1/0") == {}
    tls = TLSOptions(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
    assert tls.client_options(URL) == {
        "ssl_ca_certs": pki.ca,
        "ssl_certfile": pki.client_cert,
        "ssl_keyfile": pki.client_key,
        "ssl_cert_reqs": "required",
    }
    assert TLSOptions(verify=False).client_options("rediss+cluster://h:1") == {
        "ssl_ca_certs": None,
        "ssl_certfile": None,
        "ssl_keyfile": None,
        "ssl_cert_reqs": "none",
    }
    assert [is_tls_url(u) for u in ("rediss://h", "REDISS+cluster://h", "redis://h", "unix:///s")] == [
        True,
        True,
        False,
        False,
    ]
    # frozen strings: pickled to worker processes and Spark tasks as they are
    assert pickle.loads(pickle.dumps(tls)) == tls


@pytest.mark.parametrize(
    ("url", "fields", "fragment"),
    [
        (
            "redis://h:1/0",
            {"ca_file": "CA"},
            "TLS settings (tls_ca_file) are given, but redis://h:1/0 is not",
        ),
        ("unix:///tmp/r.sock", {"verify": False}, "TLS settings (tls_verify = false) are given"),
        (
            "redis+cluster://u:secret@h:1",
            {"cert_file": "CERT"},
            "redis+cluster://u:***@h:1 is not a TLS URL: use rediss:// (or rediss+cluster://)",
        ),
        (URL, {"ca_file": "/no/such/ca.pem"}, "tls_ca_file '/no/such/ca.pem': no such file"),
        (URL, {"cert_file": "/no/such/c.pem"}, "tls_cert_file '/no/such/c.pem': no such file"),
        (URL, {"key_file": "KEY"}, "tls_key_file"),
        (URL, {"ca_file": "CERT_AS_KEY"}, "holds no PEM certificate"),
        (URL, {"cert_file": "CERT", "key_file": "OTHER_KEY"}, "or they do not match"),
    ],
)
def test_a_tls_setting_that_cannot_work_is_a_config_error_naming_it(pki, url, fields, fragment):
    files = {
        "CA": pki.ca,
        "CERT": pki.client_cert,
        "KEY": pki.client_key,
        "CERT_AS_KEY": pki.client_key,
        "OTHER_KEY": pki.server_key,
    }
    tls = TLSOptions(**{k: files.get(v, v) if isinstance(v, str) else v for k, v in fields.items()})
    with pytest.raises(ConfigError) as caught:
        tls.client_options(url)
    assert fragment in str(caught.value)
    assert "secret" not in str(caught.value)


def test_an_encrypted_key_is_refused_rather_than_prompted_for(pki, tmp_path):
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(Path(pki.client_key).read_bytes(), None)
    locked = tmp_path / "locked.key"
    locked.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pw"),
        )
    )
    with pytest.raises(ConfigError, match="encrypted private key"):
        TLSOptions(cert_file=pki.client_cert, key_file=str(locked)).client_options(URL)


def test_the_settings_come_from_the_environment_and_are_checked_at_load(pki, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BROKER_REDIS_URL", URL)
    monkeypatch.setenv("BROKER_TLS_CA_FILE", pki.ca)
    monkeypatch.setenv("BROKER_TLS_CERT_FILE", pki.client_pem)
    monkeypatch.setenv("BROKER_TLS_VERIFY", "false")
    settings = load_settings()
    assert settings.tls == TLSOptions(ca_file=pki.ca, cert_file=pki.client_pem, verify=False)
    monkeypatch.setenv("BROKER_REDIS_URL", "redis://127.0.0.1:6380/0")
    with pytest.raises(
        ConfigError, match=r"^invalid settings \(BROKER_\* environment\): Value error, TLS settings"
    ):
        load_settings()
    monkeypatch.setenv("BROKER_REDIS_URL", URL)
    monkeypatch.setenv("BROKER_TLS_KEY_FILE", str(tmp_path / "gone.key"))
    with pytest.raises(ConfigError, match=r"tls_key_file .*gone.key': no such file"):
        load_settings()


def test_the_defaults_use_no_tls_setting(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("BROKER_TLS_CA_FILE", "BROKER_TLS_CERT_FILE", "BROKER_TLS_KEY_FILE", "BROKER_TLS_VERIFY"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings(redis_url="redis://127.0.0.1:6380/0")
    assert settings.tls == TLSOptions() and not settings.tls.configured
    assert load_settings(redis_url="rediss://127.0.0.1:6380/0").tls == TLSOptions()  # redis-py's defaults


@pytest.mark.parametrize(
    ("url", "tls", "error", "fragment"),
    [
        (
            URL,
            TLSOptions(),
            "Error 1 connecting to h:1. [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
            "self-signed certificate in certificate chain (_ssl.c:1006).",
            "set tls_ca_file (BROKER_TLS_CA_FILE) to the CA that signed it",
        ),
        (
            URL,
            TLSOptions(),
            "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: IP address mismatch",
            "does not name the host of the URL",
        ),
        (
            URL,
            TLSOptions(ca_file="ca"),
            "Error 8 while writing to socket. EOF occurred in violation of protocol (_ssl.c:2427).",
            "set tls_cert_file and tls_key_file",
        ),
        (
            URL,
            TLSOptions(ca_file="ca", cert_file="c"),
            "Error while reading from h:1 : (1, '[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca')",
            "the server refused the client certificate (tls_cert_file)",
        ),
        (
            URL,
            TLSOptions(ca_file="ca", cert_file="c"),
            "Error 8 while writing to socket. EOF occurred in violation of protocol",
            "it may not trust the client certificate (tls_cert_file)",
        ),
        (URL, None, "Timeout connecting to server", "the server may not speak TLS on this port"),
        (
            "redis://h:1/0",
            None,
            "Error while reading from h:1 : (104, 'Connection reset by peer')",
            "use a rediss:// URL",
        ),
        ("redis://h:1/0", None, "Error 111 connecting to h:1. Connection refused.", ""),
        (URL, TLSOptions(), "Error 111 connecting to h:1. Connection refused.", ""),
    ],
)
def test_a_tls_failure_is_explained_by_the_setting_to_change(url, tls, error, fragment):
    hint = tls_hint(url, tls, error)
    assert fragment in hint if fragment else hint == ""


def test_the_message_of_a_lost_connection_redacts_the_password():
    message = unreachable(
        "rediss://app:s3cr3t@h:1/0",
        None,
        OSError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"),
    )
    assert message.startswith(
        "cannot reach Redis at rediss://app:***@h:1/0: [SSL: CERTIFICATE_VERIFY_FAILED]"
    )
    assert "s3cr3t" not in message and "set tls_ca_file" in message


def test_rq_jobs_carry_the_settings_as_a_dict_and_nothing_without_them(pki):
    assert _carry(_stored(None)) == {} and _carry(_stored(TLSOptions())) == {}
    carried = _carry(_stored(TLSOptions(ca_file=pki.ca, verify=False)))
    assert carried == {"tls": {"ca_file": pki.ca, "cert_file": "", "key_file": "", "verify": False}}
    assert TLSOptions(**carried["tls"]) == TLSOptions(ca_file=pki.ca, verify=False)
