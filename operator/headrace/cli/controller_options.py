"""``headrace controller``'s command line as one typed value, and the
``ControllerSettings`` it makes (checked: one line per bad option)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from headrace.control.settings import ControlSettings
from headrace.controller.controlling import ControllerSettings
from headrace.errors import InvalidRequest
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.security.settings import AdminReadAccess, TlsSettings


@dataclass(frozen=True)
class ControllerOptions:
    """The options of ``headrace controller``, one field per click parameter."""

    state_dir: Path
    brokers: tuple[str, ...]
    admin_host: str
    admin_port: int
    poll_interval_ms: int
    transition_poll_interval_ms: int
    unload_recovery_timeout_ms: int
    preferred_leader_quiet_ms: int
    preferred_leader_rebalance: bool
    cluster_id: str
    instance: str | None
    acl_file: Path | None
    auth_tokens: tuple[str, ...]
    auth_token_file: Path | None
    admin_read_access: str
    admin_tls_cert: Path | None
    admin_tls_key: Path | None
    broker_token: str | None
    broker_token_file: Path | None
    broker_admin_ca: Path | None
    local_dir: Path | None
    schedule_clock_rate: float

    def settings(self) -> ControllerSettings:
        """The controller's settings; a click error naming the option that is wrong."""
        endpoints = [_broker_endpoint(item) for item in self.brokers]
        for flag, value in (
            ("--poll-interval-ms", self.poll_interval_ms),
            ("--transition-poll-interval-ms", self.transition_poll_interval_ms),
        ):
            if value <= 0:
                raise click.BadParameter("must be positive", param_hint=flag)
        try:
            control = ControlSettings(
                unload_recovery_timeout_ms=self.unload_recovery_timeout_ms,
                preferred_leader_rebalance=self.preferred_leader_rebalance,
                preferred_leader_quiet_ms=self.preferred_leader_quiet_ms,
            )
        except InvalidRequest as exc:
            raise click.BadParameter(
                exc.message, param_hint="--unload-recovery-timeout-ms"
            ) from exc
        if self.schedule_clock_rate <= 0:
            raise click.BadParameter("must be positive", param_hint="--schedule-clock-rate")
        if (self.admin_tls_cert is None) != (self.admin_tls_key is None):
            raise click.UsageError("--admin-tls-cert and --admin-tls-key go together")
        if self.acl_file is not None and (self.auth_tokens or self.auth_token_file):
            raise click.UsageError("--auth-token (or --auth-token-file) and --acl-file do not mix")
        return ControllerSettings(
            state_dir=self.state_dir,
            brokers=tuple(endpoints),
            cluster_id=self.cluster_id,
            poll_interval_ms=self.poll_interval_ms,
            transition_poll_interval_ms=self.transition_poll_interval_ms,
            control=control,
            admin_host=self.admin_host,
            admin_port=self.admin_port,
            instance=self.instance,
            acl_file=self.acl_file,
            auth_tokens=frozenset(self.auth_tokens),
            auth_token_file=self.auth_token_file,
            admin_read_access=AdminReadAccess(self.admin_read_access),
            admin_tls=TlsSettings(self.admin_tls_cert, self.admin_tls_key)
            if self.admin_tls_cert and self.admin_tls_key
            else None,
            # a token file replaces the token (rotation re-reads it)
            broker_token=None if self.broker_token_file else self.broker_token,
            broker_token_file=self.broker_token_file,
            broker_admin_ca=self.broker_admin_ca,
            local_dir=self.local_dir,
            schedule_clock_rate=self.schedule_clock_rate,
        )


def _broker_endpoint(item: str) -> BrokerEndpoint:
    """``--broker ID=HOST:ADMIN_PORT``."""
    ident, sep, address = item.partition("=")
    host, sep2, port = address.rpartition(":")
    if not (sep and sep2 and ident.isdigit() and port.isdigit()):
        raise click.BadParameter(f"{item!r}: expected ID=HOST:ADMIN_PORT", param_hint="--broker")
    return BrokerEndpoint(int(ident), host, admin_port=int(port))
