"""TLS on the client listener, with certificates made by openssl for the module (tests/support/certs.py).

Each refusal is checked on both sides: the client's error says why, and the broker logs `tls.refused` with the same
reason; messages stored before the refused attempts are all still there after them.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import ConnectionException, Message
from proton.utils import BlockingConnection

from broker.client import ManagementClient, ManagementError, connect
from broker.tls import ClientTls, client_domain
from tests.support.certs import Certs, make_certs
from tests.support.procs import BIN, BrokerFactory, BrokerProcess, wait_for


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerFactory]:
    f = BrokerFactory(tmp_path_factory.mktemp("tls"))
    yield f
    for _ in f.cleanup():
        pass


def tls_flags(certs: Certs, *extra: str, cert: Path | None = None, key: Path | None = None) -> list[str]:
    return ["--auto-create-queues", "--ssl-cert", str(cert or certs.server), "--ssl-key", str(key or certs.server_key),
            "--ssl-ca", str(certs.ca), *extra]


@pytest.fixture(scope="module")
def tls_only(factory: BrokerFactory, certs: Certs) -> BrokerProcess:
    return factory(*tls_flags(certs), name="tls-only")


@pytest.fixture(scope="module")
def mutual(factory: BrokerFactory, certs: Certs) -> BrokerProcess:
    """Clients need a certificate signed by the CA."""
    return factory(*tls_flags(certs, "--ssl-require-client-cert"), name="mutual")


def domain(ca: Path, cert: Path | None = None, key: Path | None = None, verify_hostname: bool = True) -> object:
    return client_domain(ClientTls(ca, cert, key, verify_hostname))


def roundtrip(url: str, ssl_domain: object, queue: str, bodies: list[str]) -> list[object]:
    """Send `bodies` to `queue` and take as many back, on one TLS connection."""
    c = connect(url, 10, "client", None, None, ssl_domain)  # type: ignore[arg-type]
    try:
        s = c.create_sender(queue)
        for b in bodies:
            s.send(Message(body=b))
        r = c.create_receiver(queue, credit=len(bodies))
        out = []
        for _ in bodies:
            out.append(r.receive(10).body)
            r.accept()
        return out
    finally:
        c.close()


def store(url: str, ssl_domain: object, queue: str, bodies: list[str]) -> None:
    c = connect(url, 10, "client", None, None, ssl_domain)  # type: ignore[arg-type]
    try:
        s = c.create_sender(queue)
        for b in bodies:
            s.send(Message(body=b))
    finally:
        c.close()


def refused(url: str, ssl_domain: object) -> str:
    """The error a client gets (a management client: the same path as ha-admin)."""
    with pytest.raises(ManagementError) as e:
        ManagementClient(url, 5, ssl_domain=ssl_domain).close()  # type: ignore[arg-type]
    return str(e.value)


def logged_refusal(b: BrokerProcess, reason_part: str) -> dict[str, object]:
    def find() -> dict[str, object] | None:
        return next((e for e in b.events() if e.get("event") == "tls.refused"
                     and reason_part in str(e.get("reason"))), None)

    return wait_for(find, 10, what=f"tls.refused '{reason_part}' in {b.name}'s log")  # type: ignore[no-any-return]


def test_a_client_trusting_the_ca_sends_and_receives_over_tls(tls_only: BrokerProcess, certs: Certs) -> None:
    assert roundtrip(tls_only.url, domain(certs.ca), "q-tls", ["a", "b", "c"]) == ["a", "b", "c"]
    # by host name as well as by address (the certificate names both)
    assert roundtrip(f"localhost:{tls_only.port}", domain(certs.ca), "q-tls", ["d"]) == ["d"]
    enabled = next(e for e in tls_only.events() if e["event"] == "tls.enabled")
    assert (enabled["tls"], enabled["client_cert"], enabled["subject"]) == ("only", False, "CN=localhost")


def test_a_plain_client_on_a_tls_only_port_is_refused_and_both_sides_say_why(tls_only: BrokerProcess,
                                                                               certs: Certs) -> None:
    store(tls_only.url, domain(certs.ca), "q-kept", ["1", "2"])
    err = refused(tls_only.url, None)
    assert "TLS connections only" in err and "--ssl-ca" in err
    logged_refusal(tls_only, "plain (non-TLS) connection on a TLS-only port")
    # Any AMQP client (here proton's own, as a third-party program would use it) is told why, in AMQP
    with pytest.raises(ConnectionException, match=r"amqp:unauthorized-access.*TLS connections only"):
        BlockingConnection(tls_only.url, timeout=5)
    # SASL offers ANONYMOUS alone: a PLAIN client is never asked for its password in clear
    with socket.create_connection(("127.0.0.1", tls_only.port), timeout=5) as s:
        s.sendall(b"AMQP\x03\x01\x00\x00")
        answer = b""
        while b"ANONYMOUS" not in answer and len(answer) < 200:
            more = s.recv(200)
            if not more:
                break
            answer += more
        assert answer.startswith(b"AMQP\x03\x01\x00\x00") and b"ANONYMOUS" in answer and b"PLAIN" not in answer
    assert roundtrip(tls_only.url, domain(certs.ca), "q-kept", ["3"])[0] == "1"  # the two are still there
    assert roundtrip(tls_only.url, domain(certs.ca), "q-kept", ["4", "5"]) == ["2", "3"]


def test_a_plain_header_sent_in_pieces_is_refused_too(tls_only: BrokerProcess, certs: Certs) -> None:
    """The first bytes may come one read at a time: 'A' could start proton's AMQP-TLS header, so it is held back
    until the rest tells; then refused like any plain header."""
    before = sum(1 for e in tls_only.events() if e["event"] == "tls.refused")
    with socket.create_connection(("127.0.0.1", tls_only.port), timeout=5) as s:
        s.sendall(b"AM")
        s.settimeout(0.2)
        with pytest.raises(TimeoutError):
            s.recv(100)  # nothing answered yet, nothing closed: it is waiting for more
        s.settimeout(5)
        s.sendall(b"QP\x03\x01\x00\x00")
        assert s.recv(8) == b"AMQP\x03\x01\x00\x00"  # the refusal's SASL header: the whole header was seen
    wait_for(lambda: sum(1 for e in tls_only.events() if e["event"] == "tls.refused") == before + 1, 10,
             what="the refusal in the log")
    assert "b'AMQP\\x03" in str([e for e in tls_only.events() if e["event"] == "tls.refused"][-1]["description"])


def test_an_encrypted_key_with_its_passphrase_file_serves_tls(factory: BrokerFactory, certs: Certs) -> None:
    b = factory(*tls_flags(certs, "--ssl-key-password-file", str(certs.key_password),
                           key=certs.server_key_encrypted), name="encrypted-key")
    assert roundtrip(b.url, domain(certs.ca), "enc", ["a", "b"]) == ["a", "b"]


def test_sighup_reloads_the_certificate_and_a_bad_file_keeps_the_one_in_use(factory: BrokerFactory, certs: Certs,
                                                                             tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    shutil.copy(certs.server, cert)
    shutil.copy(certs.server_key, key)
    b = factory(*tls_flags(certs, cert=cert, key=key), name="rotating")
    assert roundtrip(b.url, domain(certs.ca), "rot", ["before"]) == ["before"]

    def reloaded(event: str, n: int) -> None:
        assert b.proc is not None
        b.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: len([e for e in b.events() if e["event"] == event]) >= n, 10, what=f"{event} #{n}")

    shutil.copy(certs.other, cert)  # rotated: a certificate of another CA (so a client can tell which it got)
    shutil.copy(certs.other_key, key)
    reloaded("tls.reloaded", 1)
    assert roundtrip(b.url, domain(certs.other_ca), "rot", ["after"]) == ["after"]
    assert "not signed by a CA in --ssl-ca" in refused(b.url, domain(certs.ca))  # the old one is gone

    key.write_text("not a key\n")  # a rotation gone wrong: the broker keeps the certificate it has
    reloaded("tls.reload_failed", 1)
    assert roundtrip(b.url, domain(certs.other_ca), "rot", ["still"]) == ["still"]
    failed = next(e for e in b.events() if e["event"] == "tls.reload_failed")
    assert str(key) in failed["description"] and "stay" in failed["description"]


def test_with_allow_plain_one_port_takes_tls_and_plain(factory: BrokerFactory, certs: Certs) -> None:
    b = factory(*tls_flags(certs, "--ssl-allow-plain"), name="mixed")
    assert roundtrip(b.url, domain(certs.ca), "q-mixed", ["tls"]) == ["tls"]
    assert roundtrip(b.url, None, "q-mixed", ["plain"]) == ["plain"]
    assert next(e for e in b.events() if e["event"] == "tls.enabled")["tls"] == "optional"


def test_a_client_trusting_another_ca_is_refused_on_both_sides(tls_only: BrokerProcess, certs: Certs) -> None:
    store(tls_only.url, domain(certs.ca), "q-ca", ["kept"])
    err = refused(tls_only.url, domain(certs.other_ca))
    assert "TLS: the broker's certificate could not be verified: not signed by a CA in --ssl-ca" in err
    logged_refusal(tls_only, "does not trust our certificate")
    assert roundtrip(tls_only.url, domain(certs.ca), "q-ca", ["next"]) == ["kept"]


def test_a_certificate_not_naming_the_host_is_refused_unless_hostname_checks_are_off(factory: BrokerFactory,
                                                                                      certs: Certs) -> None:
    b = factory(*tls_flags(certs, cert=certs.wrong_name, key=certs.wrong_name_key), name="wrong-name")
    assert "not naming the host" in refused(b.url, domain(certs.ca))
    logged_refusal(b, "")
    assert roundtrip(b.url, domain(certs.ca, verify_hostname=False), "q-name", ["x"]) == ["x"]


def test_client_certificates_required(mutual: BrokerProcess, certs: Certs) -> None:
    store(mutual.url, domain(certs.ca, certs.client, certs.client_key), "q-mutual", ["kept"])
    # none
    assert "requires a client certificate" in refused(mutual.url, domain(certs.ca))
    logged_refusal(mutual, "no client certificate")
    # signed by another CA
    assert "does not trust our certificate" in refused(mutual.url, domain(certs.ca, certs.other, certs.other_key))
    # expired
    assert "refused our certificate: it has expired" in refused(
        mutual.url, domain(certs.ca, certs.expired, certs.expired_key))
    logged = [e for e in mutual.events() if e["event"] == "tls.refused"
              and "client's certificate could not be verified" in str(e["reason"])]
    assert len(logged) == 2, logged
    # a good one
    assert roundtrip(mutual.url, domain(certs.ca, certs.client, certs.client_key), "q-mutual", ["next"]) == ["kept"]


def test_ha_admin_uses_an_encrypted_client_key_with_its_passphrase_file(mutual: BrokerProcess,
                                                                         certs: Certs) -> None:
    admin = [str(BIN / "ha-admin"), "-b", mutual.url, "--ssl-ca", str(certs.ca), "--ssl-cert", str(certs.server),
             "--ssl-key", str(certs.server_key_encrypted)]  # a certificate the CA signed serves as a client's too
    ok = subprocess.run([*admin, "--ssl-key-password-file", str(certs.key_password), "ping"], capture_output=True,
                        text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    missing = subprocess.run([*admin, "ping"], capture_output=True, text=True, timeout=30)
    assert missing.returncode == 2 and "is encrypted: give its passphrase with --ssl-key-password-file" in \
        missing.stderr, missing.stderr


def test_ha_admin_talks_tls_and_explains_a_plain_attempt(tls_only: BrokerProcess, certs: Certs) -> None:
    admin = str(BIN / "ha-admin")
    ok = subprocess.run([admin, "-b", tls_only.url, "--ssl-ca", str(certs.ca), "ping"], capture_output=True,
                        text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    plain = subprocess.run([admin, "-b", tls_only.url, "ping"], capture_output=True, text=True, timeout=30)
    assert plain.returncode == 1 and "TLS-only broker" in plain.stderr
    wrong = subprocess.run([admin, "-b", tls_only.url, "--ssl-ca", str(certs.other_ca), "ping"],
                           capture_output=True, text=True, timeout=30)
    assert wrong.returncode == 1 and "not signed by a CA in --ssl-ca" in wrong.stderr
    bad = subprocess.run([admin, "-b", tls_only.url, "--ssl-ca", str(certs.dir / "nope.pem"), "ping"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "--ssl-ca" in bad.stderr and "no such file" in bad.stderr


def test_ha_status_takes_the_tls_options(tls_only: BrokerProcess, certs: Certs) -> None:
    status = str(BIN / "ha-status")
    r = subprocess.run([status, "-b", tls_only.url, "--ssl-ca", str(certs.ca)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1 and "not an HA broker" in r.stderr  # it got an answer: the TLS part worked
    r = subprocess.run([status, "-b", tls_only.url, "--ssl-cert", str(certs.client)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "--ssl-ca" in r.stderr


BAD_STARTS = {
    "missing certificate": (lambda c: ["--ssl-cert", str(c.dir / "nope.pem"), "--ssl-key", str(c.server_key)],
                            "--ssl-cert", "no such file"),
    "key of another certificate": (lambda c: ["--ssl-cert", str(c.server), "--ssl-key", str(c.client_key)],
                                   "--ssl-key", "does not belong to the certificate"),
    "expired certificate": (lambda c: ["--ssl-cert", str(c.expired), "--ssl-key", str(c.expired_key)],
                            "--ssl-cert", "expired on"),
    "CA file not PEM": (lambda c: ["--ssl-cert", str(c.server), "--ssl-key", str(c.server_key), "--ssl-ca",
                                   str(c.server_key)], "--ssl-ca", "no PEM certificate"),
    "key alone": (lambda c: ["--ssl-key", str(c.server_key)], "--ssl-cert and --ssl-key", "go together"),
    "encrypted key without its passphrase": (lambda c: ["--ssl-cert", str(c.server), "--ssl-key",
                                                        str(c.server_key_encrypted)],
                                             "--ssl-key", "is encrypted: give its passphrase with "
                                             "--ssl-key-password-file"),
    "encrypted key, wrong passphrase": (lambda c: ["--ssl-cert", str(c.server), "--ssl-key",
                                                   str(c.server_key_encrypted), "--ssl-key-password-file",
                                                   str(c.ca)],
                                        "--ssl-key-password-file does not hold its passphrase"),
    "passphrase file missing": (lambda c: ["--ssl-cert", str(c.server), "--ssl-key", str(c.server_key_encrypted),
                                           "--ssl-key-password-file", str(c.dir / "nope")],
                                "--ssl-key-password-file", "No such file"),
    "client certs without a CA": (lambda c: ["--ssl-cert", str(c.server), "--ssl-key", str(c.server_key),
                                             "--ssl-require-client-cert"], "--ssl-require-client-cert", "--ssl-ca"),
    "cluster without a CA": (lambda c: ["--ssl-cert", str(c.server), "--ssl-key", str(c.server_key),
                                        "--ha-cluster", "--ha-brokers-url", "127.0.0.1:1"], "--ha-cluster",
                             "verifies its primary's certificate"),
}


@pytest.mark.parametrize("case", list(BAD_STARTS))
def test_bad_tls_settings_stop_the_start_with_exit_2_and_a_message(case: str, certs: Certs, tmp_path: Path) -> None:
    flags, *parts = BAD_STARTS[case]
    r = subprocess.run([str(BIN / "ha-broker"), "--port", "0", "--log-file", str(tmp_path / "b.log"),
                        *flags(certs)], capture_output=True, text=True, timeout=30)  # type: ignore[operator]
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert line.startswith("ha-broker: ") and all(p in line for p in parts), line
    assert "Traceback" not in r.stderr


# ----- SASL EXTERNAL: the client certificate is the login ------------------------------------------------------
def test_a_certificate_login_is_the_user_its_cn_names(factory: BrokerFactory, certs: Certs, tmp_path: Path) -> None:
    """`client` (the CN of the client certificate) is an admin in the users file; the server certificate (CN
    `localhost`) used as a client certificate is nobody's: it may publish but not change wiring."""
    users = tmp_path / "users.toml"
    users.write_text('[users.client]\npassword = "unused-here"\nadmin = true\n')
    b = factory(*tls_flags(certs, "--ssl-require-client-cert", "--sasl-mechanisms", "EXTERNAL",
                           "--users-file", str(users)), name="external")
    admin_cert = domain(certs.ca, certs.client, certs.client_key)
    with ManagementClient(b.url, 10, ssl_domain=admin_cert) as m:  # type: ignore[arg-type]
        m.call("CREATE", "queue", "by-certificate", {})
    other_cert = domain(certs.ca, certs.server, certs.server_key)
    with ManagementClient(b.url, 10, ssl_domain=other_cert) as m:  # type: ignore[arg-type]
        with pytest.raises(ManagementError) as e:
            m.call("CREATE", "queue", "not-allowed", {})
        assert "403" in str(e.value) or "admin" in str(e.value)
    store(b.url, other_cert, "by-certificate", ["x"])
    users_seen = {e["user"] for e in b.events() if e.get("event") == "connection.opened"}
    assert {"client", "localhost"} <= users_seen


def test_external_without_required_client_certificates_is_refused_at_start(factory: BrokerFactory,
                                                                            certs: Certs) -> None:
    b = factory(*tls_flags(certs, "--sasl-mechanisms", "EXTERNAL"), name="external-bad", start=False)
    b.start(wait=False)
    assert b.proc is not None and b.proc.wait(30) == 2
    assert "--sasl-mechanisms EXTERNAL needs --ssl-require-client-cert" in b.stderr_file.read_text()
