"""``headrace controller``'s command line becomes one ``ControllerSettings``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
import pytest

from headrace.cli import local
from headrace.cli.controller_options import ControllerOptions
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.security.settings import AdminReadAccess, TlsSettings


def _options(*argv: str) -> ControllerOptions:
    ctx = local.controller.make_context("controller", ["--state-dir", "s", *argv])
    return ControllerOptions(**ctx.params)


def test_every_option_of_the_command_is_a_field_and_back() -> None:
    fields = {f.name for f in dataclasses.fields(ControllerOptions)}
    assert fields == {p.name for p in local.controller.params}


def test_the_defaults_make_the_settings_of_a_plain_controller() -> None:
    settings = _options("--broker", "0=127.0.0.2:9644", "--broker", "1=h:1").settings()
    assert settings.state_dir == Path("s")
    assert settings.brokers == (
        BrokerEndpoint(0, "127.0.0.2", admin_port=9644),
        BrokerEndpoint(1, "h", admin_port=1),
    )
    assert (settings.admin_host, settings.admin_port, settings.cluster_id) == (
        "127.0.0.1",
        9700,
        "local",
    )
    assert settings.admin_tls is None
    assert settings.admin_read_access is AdminReadAccess.OPEN
    assert settings.auth_tokens == frozenset()


def test_each_option_reaches_its_setting(tmp_path: Path) -> None:
    token_file = tmp_path / "broker.token"
    settings = _options(
        "--broker", "0=h:1",
        "--admin-host", "0.0.0.0",
        "--admin-port", "1234",
        "--poll-interval-ms", "50",
        "--transition-poll-interval-ms", "7",
        "--unload-recovery-timeout-ms", "999",
        "--preferred-leader-quiet-ms", "3",
        "--no-preferred-leader-rebalance",
        "--cluster-id", "c",
        "--instance", "local-1",
        "--auth-token", "a",
        "--auth-token", "b",
        "--auth-token-file", str(tmp_path / "tokens"),
        "--admin-read-access", "authenticated",
        "--admin-tls-cert", "cert.pem",
        "--admin-tls-key", "key.pem",
        "--broker-token", "ignored: the file replaces it",
        "--broker-token-file", str(token_file),
        "--broker-admin-ca", "ca.pem",
    ).settings()  # fmt: skip
    assert (settings.admin_host, settings.admin_port) == ("0.0.0.0", 1234)
    assert (settings.poll_interval_ms, settings.transition_poll_interval_ms) == (50, 7)
    assert settings.control.unload_recovery_timeout_ms == 999
    assert settings.control.preferred_leader_quiet_ms == 3
    assert settings.control.preferred_leader_rebalance is False
    assert (settings.cluster_id, settings.instance) == ("c", "local-1")
    assert settings.auth_tokens == frozenset({"a", "b"})
    assert settings.auth_token_file == tmp_path / "tokens"
    assert settings.admin_read_access is AdminReadAccess.AUTHENTICATED
    assert settings.admin_tls == TlsSettings(Path("cert.pem"), Path("key.pem"))
    assert (settings.broker_token, settings.broker_token_file) == (None, token_file)
    assert settings.broker_admin_ca == Path("ca.pem")


def test_the_acl_file_takes_no_tokens_and_a_bad_broker_is_named() -> None:
    acl = _options("--broker", "0=h:1", "--acl-file", "acl.yaml", "--broker-token", "t")
    settings = acl.settings()
    assert (settings.acl_file, settings.broker_token) == (Path("acl.yaml"), "t")
    with pytest.raises(click.UsageError, match="do not mix"):
        _options("--broker", "0=h:1", "--acl-file", "acl.yaml", "--auth-token", "x").settings()
    with pytest.raises(click.UsageError, match="go together"):
        _options("--broker", "0=h:1", "--admin-tls-cert", "c").settings()
    with pytest.raises(click.BadParameter, match="expected ID=HOST:ADMIN_PORT"):
        _options("--broker", "h:1").settings()
    with pytest.raises(click.BadParameter, match="must be positive"):
        _options("--broker", "0=h:1", "--poll-interval-ms", "0").settings()
