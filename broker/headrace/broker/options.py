"""``headrace broker``'s command line, declared once: each option with where its value
goes in :class:`~headrace.broker.config.BrokerSettings`, its type, default and help.

``BROKER_OPTIONS`` is the table; ``broker_options`` puts it on a click command and
``broker_settings`` turns the parsed values into the settings. An option's value
lands in a ``BrokerSettings`` field, a ``LogConfig`` field, one of the two
``TlsSettings`` (data port, admin HTTP), or is read by the command itself.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import click

from headrace.broker.config import BrokerSettings, ListenerSettings
from headrace.kafka.offsets_log import DEFAULT_OFFSETS_TOPIC
from headrace.protocol.endpoints import DEFAULT_LISTENER
from headrace.security.settings import AdminReadAccess, TlsSettings
from headrace.storage.bookkeeping import FsyncPolicy, LogConfig


class Into(enum.Enum):
    """Where an option's value goes."""

    #: a field of ``BrokerSettings``
    SETTINGS = "settings"
    #: a field of ``BrokerSettings.log`` (``LogConfig``)
    LOG = "log"
    #: a field of ``BrokerSettings.tls``, the data port's TLS
    TLS = "tls"
    #: a field of ``BrokerSettings.admin_tls``, admin HTTP's TLS
    ADMIN_TLS = "admin_tls"
    #: read by the command itself (no setting)
    COMMAND = "command"


@dataclass(frozen=True)
class BrokerOption:
    """One option: its click declaration, and the field its (converted) value sets."""

    #: click's parameter declarations: the flags, and the parameter name when it is not
    #: the long flag's
    decls: tuple[str, ...]
    into: Into
    #: the field of ``into`` (for ``Into.COMMAND``, the parameter's name)
    field: str
    type: Any = None
    default: Any = None
    help: str | None = None
    envvar: str | None = None
    show_default: bool | None = None
    is_flag: bool = False
    multiple: bool = False
    required: bool = False
    #: the command-line value to the setting's (None: as it is)
    convert: Callable[[Any], Any] | None = None

    @property
    def name(self) -> str:
        """The click parameter's name: the declared one, else the long flag's."""
        plain = [d for d in self.decls if not d.startswith("-")]
        return plain[0] if plain else self.decls[0].lstrip("-").replace("-", "_")

    def click_option(self) -> Callable[[Any], Any]:
        """The click decorator, with the attributes set here (click's own defaults hold
        for the rest)."""
        attrs: dict[str, Any] = {
            "type": self.type,
            "help": self.help,
            "envvar": self.envvar,
            "show_default": self.show_default,
        }
        attrs = {k: v for k, v in attrs.items() if v is not None}
        if not (self.is_flag or self.multiple or self.required):
            # None too: an option left unset is None, not click's "no default" sentinel
            attrs["default"] = self.default
        if self.is_flag:
            attrs["is_flag"] = True
        if self.multiple:
            attrs["multiple"] = True
        if self.required:
            attrs["required"] = True
        return click.option(*self.decls, **attrs)


_PATH = click.Path(path_type=Path)
_FILE = click.Path(path_type=Path, dir_okay=False)
S, LOG, TLS, ADMIN_TLS, COMMAND = Into.SETTINGS, Into.LOG, Into.TLS, Into.ADMIN_TLS, Into.COMMAND

#: every option of ``headrace broker``, in ``--help`` order; names, defaults, envvars and
#: help are what the docs, the Helm chart and the operator's StatefulSet pass
BROKER_OPTIONS: tuple[BrokerOption, ...] = (
    BrokerOption(
        ("--standalone",),
        COMMAND,
        "standalone",
        is_flag=True,
        help="Own every partition of every topic (no controller).",
    ),
    BrokerOption(
        ("--cluster", "cluster_mode"),
        S,
        "cluster_mode",
        is_flag=True,
        help="Take partitions, roles and epochs from a controller's pushed topology.",
    ),
    BrokerOption(
        ("--replica-lag-max-ms",), S, "replica_lag_max_ms", int, 10_000, show_default=True
    ),
    BrokerOption(
        ("--replica-fetch-wait-ms",), S, "replica_fetch_wait_ms", int, 500, show_default=True
    ),
    BrokerOption(
        ("--replica-fetch-silence-max-ms",),
        S,
        "replica_fetch_silence_max_ms",
        click.IntRange(min=1),
        3_000,
        show_default=True,
        help="A follower that has not fetched for this long leaves the live replica set.",
    ),
    BrokerOption(
        ("--replication-token",),
        S,
        "replication_token",
        envvar="HEADRACE_REPLICATION_TOKEN",
        help="Token this broker presents to other brokers (when they require auth).",
    ),
    BrokerOption(
        ("--replication-token-file",),
        S,
        "replication_token_file",
        _FILE,
        help="Replication tokens, one per line, re-read on change: the first is presented to"
        " other brokers, every one is accepted from them (rotation: docs/security.md §9)."
        " Replaces --replication-token.",
    ),
    BrokerOption(("--data-dir",), S, "data_dir", _PATH, required=True),
    BrokerOption(
        ("--host",),
        S,
        "host",
        default="127.0.0.1",
        show_default=True,
        help="Address the data port binds to.",
    ),
    BrokerOption(("--port",), S, "port", int, 9092, show_default=True),
    BrokerOption(("--admin-host",), S, "admin_host", default="127.0.0.1", show_default=True),
    BrokerOption(
        ("--admin-port",),
        S,
        "admin_port",
        int,
        9644,
        show_default=True,
        help="-1 disables admin HTTP.",
    ),
    BrokerOption(
        ("--advertised-host",), S, "advertised_host", help="Host clients are told to connect to."
    ),
    BrokerOption(
        ("--listener", "listeners"),
        COMMAND,
        "listeners",
        multiple=True,
        help="Another data listener, NAME=HOST:PORT (repeatable; port 0: a free one): clients"
        " that connect through it are told every broker's address on the listener of that"
        f" NAME (docs/operations.md). {DEFAULT_LISTENER!r} names --host/--port.",
    ),
    BrokerOption(
        ("--advertised-listener", "advertised_listeners"),
        COMMAND,
        "advertised_listeners",
        multiple=True,
        help="NAME=HOST[:PORT]: what clients of listener NAME are told to dial (default: its"
        " bind host and bound port). PORT+id: PORT plus --broker-id (one node port per"
        " broker of a StatefulSet).",
    ),
    BrokerOption(
        ("--listener-tls-cert", "listener_tls_certs"),
        COMMAND,
        "listener_tls_certs",
        multiple=True,
        help="NAME=PATH: the certificate listener NAME serves instead of --tls-cert (with"
        " --listener-tls-key and --tls-cert: clients are checked as on the data port).",
    ),
    BrokerOption(
        ("--listener-tls-key", "listener_tls_keys"),
        COMMAND,
        "listener_tls_keys",
        multiple=True,
        help="NAME=PATH: the key of --listener-tls-cert NAME.",
    ),
    BrokerOption(
        ("--rack",),
        S,
        "rack",
        envvar="HEADRACE_RACK",
        help="The rack (zone) this broker runs in: the controller spreads each partition's"
        " replicas over racks.",
        convert=lambda rack: rack or None,  # an empty $HEADRACE_RACK is no rack
    ),
    BrokerOption(
        ("--kafka-port",),
        S,
        "kafka_port",
        int,
        -1,
        show_default=True,
        help="The Kafka listener's port (docs/kafka.md); -1 = off, 0 = a free one.",
    ),
    BrokerOption(
        ("--kafka-host",),
        S,
        "kafka_host",
        help="Address the Kafka listener binds to (default --host).",
    ),
    BrokerOption(
        ("--kafka-advertised-host",),
        S,
        "kafka_advertised_host",
        help="Host Kafka clients are told to connect to.",
    ),
    BrokerOption(
        ("--kafka-advertised-port",),
        S,
        "kafka_advertised_port",
        int,
        help="Port Kafka clients are told to connect to (default: the bound one).",
    ),
    BrokerOption(
        ("--kafka-offsets-topic",),
        S,
        "kafka_offsets_topic",
        default=DEFAULT_OFFSETS_TOPIC,
        show_default=True,
        help="Cluster mode: the topic Kafka groups' committed offsets are kept in; the leader"
        " of a group's partition of it coordinates the group.",
    ),
    BrokerOption(("--broker-id",), S, "broker_id", int, 0, show_default=True),
    BrokerOption(
        ("--fsync",),
        LOG,
        "fsync",
        click.Choice([p.value for p in FsyncPolicy]),
        "interval",
        show_default=True,
        convert=FsyncPolicy,
    ),
    BrokerOption(("--flush-interval-ms",), LOG, "flush_interval_ms", int, 1000, show_default=True),
    BrokerOption(
        ("--checkpoint-interval-ms",),
        LOG,
        "checkpoint_interval_ms",
        click.IntRange(min=1),
        LogConfig().checkpoint_interval_ms,
        show_default=True,
        help="How often recovery points are written: bounds what a restart after a crash scans.",
    ),
    BrokerOption(
        ("--segment-bytes",),
        LOG,
        "segment_bytes",
        int,
        LogConfig().segment_bytes,
        show_default=True,
    ),
    BrokerOption(
        ("--cohort-grace-ms",),
        S,
        "cohort_grace_ms",
        int,
        10_000,
        show_default=True,
        help="How long a revoked partition's holder may finish in-flight records.",
    ),
    BrokerOption(
        ("--retention-check-interval-ms",),
        S,
        "retention_check_interval_ms",
        int,
        30_000,
        show_default=True,
        help="How often retention deletes segments beyond the topic's time and size bounds.",
    ),
    BrokerOption(
        ("--tier-delete-grace-ms",),
        S,
        "tier_delete_grace_ms",
        int,
        30_000,
        show_default=True,
        help="How long objects that retention removed from a manifest stay for readers that"
        " hold the old manifest, before they are deleted.",
    ),
    BrokerOption(
        ("--cursor-flush-interval-ms",),
        S,
        "cursor_flush_interval_ms",
        int,
        200,
        show_default=True,
        help="Cursor changes reach disk within this window: the redelivery bound after a crash.",
    ),
    BrokerOption(
        ("--auth-token", "auth_tokens"),
        S,
        "auth_tokens",
        multiple=True,
        help="Accepted client token (repeatable).",
        convert=frozenset,
    ),
    BrokerOption(
        ("--auth-token-file",),
        S,
        "auth_token_file",
        _FILE,
        help="Accepted client tokens, one per line, re-read on SIGHUP and on change (with or"
        " instead of --auth-token).",
    ),
    BrokerOption(("--tls-cert",), TLS, "cert_file", _PATH),
    BrokerOption(("--tls-key",), TLS, "key_file", _PATH),
    BrokerOption(("--tls-client-ca",), TLS, "client_ca_file", _PATH, help="Require client certs."),
    BrokerOption(
        ("--tls-client-auth",),
        TLS,
        "client_auth_required",
        click.Choice(["required", "optional"]),
        "required",
        show_default=True,
        help="With --tls-client-ca: refuse clients without a certificate, or check one only when"
        " given (the others authenticate by token).",
        convert=lambda auth: auth == "required",
    ),
    BrokerOption(
        ("--tls-ca",),
        TLS,
        "ca_file",
        _PATH,
        help="CA the other brokers' certificates are verified with when fetching from them"
        " (default: --tls-client-ca, else --tls-cert).",
    ),
    BrokerOption(
        ("--tls-server-name",),
        TLS,
        "server_name",
        help="Name the other brokers' certificates must carry (default: the host dialled); on"
        " Kubernetes the cluster's Service name, as brokers dial one another by pod IP.",
    ),
    BrokerOption(
        ("--acl-file",),
        S,
        "acl_file",
        _FILE,
        help="Principals, their credentials and grants (YAML/JSON; docs/security.md)."
        " Turns on per-request ACL checks and signed member identities.",
    ),
    BrokerOption(
        ("--acl-reload-interval-ms",),
        S,
        "acl_reload_interval_ms",
        click.IntRange(min=0),
        2000,
        show_default=True,
        help="How often the credential files (ACL, token files, cluster key) are checked for"
        " changes and reloaded; 0: only on SIGHUP. A bad file keeps what is in force"
        ' (headrace_acl_reloads_total{source,result="error"}).',
    ),
    BrokerOption(
        ("--admin-read-access",),
        S,
        "admin_read_access",
        click.Choice([a.value for a in AdminReadAccess]),
        AdminReadAccess.OPEN.value,
        show_default=True,
        help="Who may read admin HTTP (metrics, topics, status, heartbeat); /healthz and /readyz"
        " stay open. 'authenticated' takes a bearer token that authenticates on the data port."
        " Changes always take credentials when the data port does.",
        convert=AdminReadAccess,
    ),
    BrokerOption(("--admin-tls-cert",), ADMIN_TLS, "cert_file", _PATH),
    BrokerOption(("--admin-tls-key",), ADMIN_TLS, "key_file", _PATH),
    BrokerOption(
        ("--admin-tls-client-ca",),
        ADMIN_TLS,
        "client_ca_file",
        _PATH,
        help="Require admin HTTP clients to present a certificate signed by this CA.",
    ),
    BrokerOption(
        ("--cluster-key-file",),
        S,
        "cluster_key_file",
        _FILE,
        help="HMAC keys (64 hex digits a line, mode 0600) signing member identities; shared by"
        " the cluster's brokers. The first signs, any verifies; re-read on change. Default with"
        " --acl-file: DATA_DIR/cluster.key, made if absent (standalone only).",
    ),
    BrokerOption(
        ("--object-store", "object_store_url"),
        S,
        "object_store_url",
        help="Where tiered topics upload segments: file:///DIR or s3://HOST:PORT/BUCKET"
        " (credentials from HEADRACE_OBJECT_STORE_ACCESS_KEY/_SECRET_KEY). Unset: no tiering.",
    ),
    BrokerOption(
        ("--cluster-id",),
        S,
        "cluster_id",
        help="Names this cluster in object-store keys (standalone; a controller sets it in a"
        " cluster).",
        convert=lambda cluster_id: cluster_id or "standalone",
    ),
    BrokerOption(
        ("--announce",),
        COMMAND,
        "announce",
        is_flag=True,
        help="Print how to use the broker once it is ready.",
    ),
)

F = TypeVar("F", bound=Callable[..., Any])


def broker_options(command: F) -> F:
    """Put every option of ``BROKER_OPTIONS`` on ``command``, in the table's order."""
    decorated: Any = command
    for option in reversed(BROKER_OPTIONS):  # click lists the last decorator applied first
        decorated = option.click_option()(decorated)
    return decorated  # type: ignore[no-any-return]


def broker_settings(options: Mapping[str, Any]) -> BrokerSettings:
    """The settings ``options`` (click's parsed values, by parameter name) make.

    Refuses, as usage errors: neither or both of ``--standalone`` and ``--cluster``, and a
    TLS certificate without its key (or the other way round)."""
    values: dict[Into, dict[str, Any]] = {into: {} for into in Into}
    for option in BROKER_OPTIONS:
        value = options[option.name]
        values[option.into][option.field] = option.convert(value) if option.convert else value
    settings, tls, admin_tls = values[S], values[TLS], values[ADMIN_TLS]
    if values[COMMAND]["standalone"] == settings["cluster_mode"]:
        raise click.UsageError("choose one of --standalone or --cluster")
    if (tls["cert_file"] is None) != (tls["key_file"] is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if (admin_tls["cert_file"] is None) != (admin_tls["key_file"] is None):
        raise click.UsageError("--admin-tls-cert and --admin-tls-key go together")
    data_tls = TlsSettings(**tls) if tls["cert_file"] and tls["key_file"] else None
    settings["listeners"] = listener_tls(
        listener_settings(
            values[COMMAND]["listeners"],
            values[COMMAND]["advertised_listeners"],
            settings["broker_id"],
        ),
        values[COMMAND]["listener_tls_certs"],
        values[COMMAND]["listener_tls_keys"],
        data_tls,
    )
    if settings["replication_token_file"]:
        settings["replication_token"] = None  # the file replaces the token
    return BrokerSettings(
        **settings,
        log=LogConfig(**values[LOG]),
        tls=data_tls,
        admin_tls=TlsSettings(**admin_tls)
        if admin_tls["cert_file"] and admin_tls["key_file"]
        else None,
    )


def _named(text: str, flag: str) -> tuple[str, str]:
    name, sep, address = text.partition("=")
    if not sep or not name or not address:
        raise click.BadParameter(f"{text!r}: expected NAME=HOST:PORT", param_hint=flag)
    return name, address


def _host_port(
    text: str, flag: str, *, port_required: bool, broker_id: int | None = None
) -> tuple[str, int | None]:
    """``HOST:PORT``, ``[V6HOST]:PORT`` or (without ``port_required``) a bare host; with
    ``broker_id``, ``PORT+id`` is ``PORT`` plus it."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else None
        if not sep or (rest and port_text is None):
            raise click.BadParameter(f"{text!r}: expected [HOST]:PORT", param_hint=flag)
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, None
    if not host or (port_text is None and port_required):
        raise click.BadParameter(f"{text!r}: expected HOST:PORT", param_hint=flag)
    if port_text is None:
        return host, None
    offset = 0
    if broker_id is not None and port_text.endswith("+id"):
        port_text, offset = port_text.removesuffix("+id"), broker_id
    if not port_text.isdigit() or int(port_text) + offset > 65535:
        raise click.BadParameter(f"{text!r}: the port must be 0..65535", param_hint=flag)
    return host, int(port_text) + offset


def listener_tls(
    listeners: tuple[ListenerSettings, ...],
    certs: tuple[str, ...],
    keys: tuple[str, ...],
    data_tls: TlsSettings | None,
) -> tuple[ListenerSettings, ...]:
    """``listeners`` with the certificates ``--listener-tls-cert NAME=PATH`` and
    ``--listener-tls-key NAME=PATH`` give them: the data port's TLS with that pair (its
    client CA and checks stay). Refuses, as bad parameters: a name no ``--listener``
    declares, a name twice, a certificate without its key (or the other way round), and
    one without the data port's TLS (``--tls-cert``)."""
    pairs: dict[str, dict[str, Path]] = {}
    for flag, texts, part in (
        ("--listener-tls-cert", certs, "cert"),
        ("--listener-tls-key", keys, "key"),
    ):
        for text in texts:
            name, path = _named(text, flag)
            if name not in {listener.name for listener in listeners}:
                raise click.BadParameter(f"{name!r}: no --listener of that name", param_hint=flag)
            if part in pairs.setdefault(name, {}):
                raise click.BadParameter(f"listener {name!r} given twice", param_hint=flag)
            pairs[name][part] = Path(path)
    if pairs and data_tls is None:
        raise click.UsageError("--listener-tls-cert needs --tls-cert and --tls-key")
    for name, pair in pairs.items():
        if set(pair) != {"cert", "key"}:
            raise click.UsageError(
                f"--listener-tls-cert and --listener-tls-key go together (listener {name!r})"
            )
    return tuple(
        listener
        if listener.name not in pairs or data_tls is None
        else replace(
            listener,
            tls=replace(
                data_tls,
                cert_file=pairs[listener.name]["cert"],
                key_file=pairs[listener.name]["key"],
            ),
        )
        for listener in listeners
    )


def listener_settings(
    listeners: tuple[str, ...], advertised: tuple[str, ...], broker_id: int = 0
) -> tuple[ListenerSettings, ...]:
    """``--listener NAME=HOST:PORT`` and ``--advertised-listener NAME=HOST[:PORT]`` as
    settings (an advertised ``PORT+id`` is ``PORT`` plus ``broker_id``). Refuses, as bad parameters: a malformed address, the default listener's
    name, a name twice, and an advertised address for a listener that is not declared."""
    bound: dict[str, tuple[str, int]] = {}
    for text in listeners:
        name, address = _named(text, "--listener")
        if name == DEFAULT_LISTENER:
            raise click.BadParameter(
                f"{name!r} is the default listener: set it with --host/--port",
                param_hint="--listener",
            )
        if name in bound:
            raise click.BadParameter(f"listener {name!r} given twice", param_hint="--listener")
        host, port = _host_port(address, "--listener", port_required=True)
        assert port is not None  # port_required
        bound[name] = (host, port)
    told: dict[str, tuple[str, int | None]] = {}
    for text in advertised:
        name, address = _named(text, "--advertised-listener")
        if name not in bound:
            raise click.BadParameter(
                f"{name!r}: no --listener of that name", param_hint="--advertised-listener"
            )
        if name in told:
            raise click.BadParameter(
                f"listener {name!r} advertised twice", param_hint="--advertised-listener"
            )
        told[name] = _host_port(
            address, "--advertised-listener", port_required=False, broker_id=broker_id
        )
    return tuple(
        ListenerSettings(name, host, port, *told.get(name, (None, None)))
        for name, (host, port) in bound.items()
    )
