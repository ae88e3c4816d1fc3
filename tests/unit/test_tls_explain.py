"""broker.tls.explain: OpenSSL's texts (as proton hands them over, seen in tests/broker/test_tls.py) -> the reasons
docs/tls.md lists, on each side."""

from __future__ import annotations

import pytest

from broker.tls import explain, is_tls_failure

SEEN = [
    # (side, proton's description, the reason's words)
    ("client", "SSL Failure: not a TLS handshake (plain connection on a TLS-only port): first bytes b'AMQP'",
     "a plain (non-TLS) connection on a TLS-only port"),
    ("client", "SSL Failure: error:0A000418:SSL routines::tlsv1 alert unknown ca",
     "the client does not trust our certificate"),
    ("client", "SSL Failure: error:0A0000C7:SSL routines::peer did not return a certificate",
     "no client certificate: this broker requires one"),
    ("client", "SSL Failure: error:0A000086:SSL routines::certificate verify failed",
     "the client's certificate could not be verified: not signed by a CA in --ssl-ca, or expired"),
    ("broker", "SSL Failure: error:0A000086:SSL routines::certificate verify failed",
     "the broker's certificate could not be verified: not signed by a CA in --ssl-ca, expired, or not naming"),
    ("broker", "SSL Failure: error:0A00045C:SSL routines::tlsv13 alert certificate required",
     "the broker requires a client certificate and we sent none"),
    ("broker", "SSL Failure: error:0A000415:SSL routines::sslv3 alert certificate expired",
     "the broker refused our certificate: it has expired"),
    ("broker", "SSL Failure: error:0A000418:SSL routines::tlsv1 alert unknown ca",
     "the broker does not trust our certificate: it is not signed by a CA in its --ssl-ca"),
    ("broker", "SSL Failure: something new", "TLS handshake failed"),
]


@pytest.mark.parametrize(("side", "description", "words"), SEEN)
def test_each_openssl_text_gets_its_reason(side: str, description: str, words: str) -> None:
    assert words in explain(description, side)
    assert is_tls_failure("amqp:connection:framing-error", description)


def test_other_transport_errors_are_not_tls_failures() -> None:
    assert not is_tls_failure("amqp:connection:framing-error", "Expected AMQP protocol header: no protocol header")
    assert not is_tls_failure("proton:io", "SSL Failure: read failed")
    assert not is_tls_failure(None, None)
