"""The options `ha-admin` and `ha-status` share. TLS (docs/tls.md): one decorator, one function to turn them into a
proton client domain, so both tools take and check them the same way. And the click callbacks that check their
addresses before anything connects (`--broker`; `--zk-hosts`, `--zk-path`), with the broker's own readers of them
(broker.config), so a tool never takes what a broker would refuse."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from proton import SSLDomain

from broker.config import check_zk_path, parse_address, parse_zk_hosts, split_list
from broker.tls import ClientTls, TlsError, check_files, client_domain, read_password

F = TypeVar("F", bound=Callable[..., Any])

_PATH = click.Path(path_type=Path)


def tls_options(f: F) -> F:
    """--ssl-ca (TLS on: the CA that signs the brokers' certificates), --ssl-cert/--ssl-key (this tool's own
    certificate, for a broker with --ssl-require-client-cert; --ssl-key-password-file for an encrypted key),
    --no-ssl-verify-hostname."""
    for option in reversed((
        click.option("--ssl-ca", type=_PATH, default=None,
                     help="connect over TLS, trusting brokers whose certificate this CA signed"),
        click.option("--ssl-cert", type=_PATH, default=None,
                     help="client certificate (for brokers with --ssl-require-client-cert)"),
        click.option("--ssl-key", type=_PATH, default=None, help="key of --ssl-cert"),
        click.option("--ssl-key-password-file", type=_PATH, default=None,
                     help="file whose first line is the passphrase of an encrypted --ssl-key"),
        click.option("--ssl-verify-hostname/--no-ssl-verify-hostname", default=True, show_default=True,
                     help="the broker's certificate must name the host given in --broker"),
    )):
        f = option(f)
    return f


def settings(ca: Path | None, cert: Path | None, key: Path | None, verify_hostname: bool,
             key_password_file: Path | None = None) -> ClientTls | None:
    """The TLS settings of these options, or None (plain AMQP); a bad file or combination raises TlsError with the
    flag and the reason."""
    if ca is None:
        if cert is not None or key is not None or key_password_file is not None:
            raise TlsError("--ssl-cert/--ssl-key/--ssl-key-password-file need --ssl-ca (TLS is on only with the CA "
                           "that signs the brokers' certificates)")
        return None
    password = read_password(key_password_file) if key_password_file is not None else None
    problems = check_files(cert, key, ca, password=password)
    if problems:
        raise TlsError("; ".join(problems))
    return ClientTls(ca, cert, key, verify_hostname, password)


def domain(tls: ClientTls | None) -> SSLDomain | None:
    """A fresh proton domain for one connection (a domain is not shared between threads: ha-status asks the
    members in parallel)."""
    return client_domain(tls) if tls is not None else None


def broker_addresses(several: bool) -> Callable[[click.Context, click.Parameter, str], str]:
    """A click callback for `--broker`: each address is host:port (a port left out is 5672), several only when
    `several` (comma separated); a bad one is a usage error naming it, before anything connects."""
    def check(ctx: click.Context, param: click.Parameter, value: str) -> str:
        parts = split_list(value)
        if len(parts) != 1 and not several:
            raise click.BadParameter(f"one broker's host:port, got {len(parts) or 'none'}: {value!r}")
        for part in parts:
            try:
                parse_address(part, default_port=5672)
            except ValueError as e:
                raise click.BadParameter(str(e)) from None
        return value

    return check


def zk_hosts(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback for `--zk-hosts`: kazoo's hosts string, checked before anything connects."""
    if value is not None:
        try:
            parse_zk_hosts(value)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return value


def zk_path(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A click callback for `--zk-path`."""
    try:
        return check_zk_path(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
