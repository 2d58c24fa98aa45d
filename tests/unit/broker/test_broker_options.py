"""``headrace broker``'s options, declared in one table (``broker.options``), are the ones
the command had before the table: the same flags, defaults and environment variables
(the docs, the Helm chart and the operator's StatefulSet pass them), and each sets the
``BrokerSettings`` field it set."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from headrace.broker.config import BrokerSettings, ListenerSettings
from headrace.broker.main import broker
from headrace.broker.options import broker_settings
from headrace.security.settings import AdminReadAccess
from headrace.storage.bookkeeping import FsyncPolicy

#: (flag, parameter, default, envvar) of every option, in --help order, as the command
#: declared them one click decorator each (required and repeatable ones: no default)
OPTIONS_BEFORE = [
    ("--standalone", "standalone", False, None),
    ("--cluster", "cluster_mode", False, None),
    ("--replica-lag-max-ms", "replica_lag_max_ms", 10000, None),
    ("--replica-fetch-wait-ms", "replica_fetch_wait_ms", 500, None),
    ("--replica-fetch-silence-max-ms", "replica_fetch_silence_max_ms", 3000, None),
    ("--replication-token", "replication_token", None, "HEADRACE_REPLICATION_TOKEN"),
    ("--replication-token-file", "replication_token_file", None, None),
    ("--data-dir", "data_dir", None, None),
    ("--host", "host", "127.0.0.1", None),
    ("--port", "port", 9092, None),
    ("--admin-host", "admin_host", "127.0.0.1", None),
    ("--admin-port", "admin_port", 9644, None),
    ("--advertised-host", "advertised_host", None, None),
    ("--listener", "listeners", None, None),
    ("--advertised-listener", "advertised_listeners", None, None),
    ("--listener-tls-cert", "listener_tls_certs", None, None),
    ("--listener-tls-key", "listener_tls_keys", None, None),
    ("--rack", "rack", None, "HEADRACE_RACK"),
    ("--kafka-port", "kafka_port", -1, None),
    ("--kafka-host", "kafka_host", None, None),
    ("--kafka-advertised-host", "kafka_advertised_host", None, None),
    ("--kafka-advertised-port", "kafka_advertised_port", None, None),
    ("--kafka-offsets-topic", "kafka_offsets_topic", "kafka.group-offsets", None),
    ("--broker-id", "broker_id", 0, None),
    ("--fsync", "fsync", "interval", None),
    ("--flush-interval-ms", "flush_interval_ms", 1000, None),
    ("--checkpoint-interval-ms", "checkpoint_interval_ms", 5000, None),
    ("--segment-bytes", "segment_bytes", 268435456, None),
    ("--cohort-grace-ms", "cohort_grace_ms", 10000, None),
    ("--retention-check-interval-ms", "retention_check_interval_ms", 30000, None),
    ("--tier-delete-grace-ms", "tier_delete_grace_ms", 30000, None),
    ("--cursor-flush-interval-ms", "cursor_flush_interval_ms", 200, None),
    ("--auth-token", "auth_tokens", None, None),
    ("--auth-token-file", "auth_token_file", None, None),
    ("--tls-cert", "tls_cert", None, None),
    ("--tls-key", "tls_key", None, None),
    ("--tls-client-ca", "tls_client_ca", None, None),
    ("--tls-client-auth", "tls_client_auth", "required", None),
    ("--tls-ca", "tls_ca", None, None),
    ("--tls-server-name", "tls_server_name", None, None),
    ("--acl-file", "acl_file", None, None),
    ("--acl-reload-interval-ms", "acl_reload_interval_ms", 2000, None),
    ("--admin-read-access", "admin_read_access", "open", None),
    ("--admin-tls-cert", "admin_tls_cert", None, None),
    ("--admin-tls-key", "admin_tls_key", None, None),
    ("--admin-tls-client-ca", "admin_tls_client_ca", None, None),
    ("--cluster-key-file", "cluster_key_file", None, None),
    ("--object-store", "object_store_url", None, None),
    ("--cluster-id", "cluster_id", None, None),
    ("--announce", "announce", False, None),
]

#: each setting the command line could set, with a flag that sets it to a value other
#: than its default (a dotted path reaches into ``log``, ``tls`` and ``admin_tls``)
SETTABLE_BEFORE: list[tuple[str, list[str], Any]] = [
    ("data_dir", [], Path("d")),
    ("host", ["--host", "0.0.0.0"], "0.0.0.0"),
    ("port", ["--port", "19092"], 19092),
    ("admin_host", ["--admin-host", "10.0.0.1"], "10.0.0.1"),
    ("admin_port", ["--admin-port", "-1"], -1),
    ("advertised_host", ["--advertised-host", "b.example"], "b.example"),
    ("rack", ["--rack", "zone-a"], "zone-a"),
    ("kafka_port", ["--kafka-port", "9093"], 9093),
    ("kafka_host", ["--kafka-host", "0.0.0.0"], "0.0.0.0"),
    ("kafka_advertised_host", ["--kafka-advertised-host", "k.example"], "k.example"),
    ("kafka_advertised_port", ["--kafka-advertised-port", "19093"], 19093),
    ("kafka_offsets_topic", ["--kafka-offsets-topic", "offsets"], "offsets"),
    ("broker_id", ["--broker-id", "7"], 7),
    ("cluster_id", ["--cluster-id", "prod"], "prod"),
    ("log.fsync", ["--fsync", "always"], FsyncPolicy.ALWAYS),
    ("log.flush_interval_ms", ["--flush-interval-ms", "5"], 5),
    ("log.checkpoint_interval_ms", ["--checkpoint-interval-ms", "6"], 6),
    ("log.segment_bytes", ["--segment-bytes", "1048576"], 1048576),
    ("auth_tokens", ["--auth-token", "a", "--auth-token", "b"], frozenset({"a", "b"})),
    ("auth_token_file", ["--auth-token-file", "tokens"], Path("tokens")),
    ("tls.cert_file", ["--tls-cert", "c.pem", "--tls-key", "k.pem"], Path("c.pem")),
    ("tls.key_file", ["--tls-cert", "c.pem", "--tls-key", "k.pem"], Path("k.pem")),
    (
        "tls.client_ca_file",
        ["--tls-cert", "c", "--tls-key", "k", "--tls-client-ca", "ca.pem"],
        Path("ca.pem"),
    ),
    (
        "tls.client_auth_required",
        ["--tls-cert", "c", "--tls-key", "k", "--tls-client-auth", "optional"],
        False,
    ),
    (
        "tls.ca_file",
        ["--tls-cert", "c", "--tls-key", "k", "--tls-ca", "peers.pem"],
        Path("peers.pem"),
    ),
    (
        "tls.server_name",
        ["--tls-cert", "c", "--tls-key", "k", "--tls-server-name", "svc"],
        "svc",
    ),
    ("acl_file", ["--acl-file", "acl.yaml"], Path("acl.yaml")),
    ("acl_reload_interval_ms", ["--acl-reload-interval-ms", "0"], 0),
    (
        "admin_read_access",
        ["--admin-read-access", "authenticated"],
        AdminReadAccess.AUTHENTICATED,
    ),
    (
        "admin_tls.cert_file",
        ["--admin-tls-cert", "ac.pem", "--admin-tls-key", "ak.pem"],
        Path("ac.pem"),
    ),
    (
        "admin_tls.key_file",
        ["--admin-tls-cert", "ac.pem", "--admin-tls-key", "ak.pem"],
        Path("ak.pem"),
    ),
    (
        "admin_tls.client_ca_file",
        ["--admin-tls-cert", "c", "--admin-tls-key", "k", "--admin-tls-client-ca", "aca.pem"],
        Path("aca.pem"),
    ),
    ("cluster_key_file", ["--cluster-key-file", "cluster.key"], Path("cluster.key")),
    ("cursor_flush_interval_ms", ["--cursor-flush-interval-ms", "9"], 9),
    ("cohort_grace_ms", ["--cohort-grace-ms", "11"], 11),
    ("retention_check_interval_ms", ["--retention-check-interval-ms", "12"], 12),
    ("cluster_mode", ["--cluster"], True),
    ("replica_lag_max_ms", ["--replica-lag-max-ms", "13"], 13),
    ("replica_fetch_silence_max_ms", ["--replica-fetch-silence-max-ms", "14"], 14),
    ("replica_fetch_wait_ms", ["--replica-fetch-wait-ms", "15"], 15),
    ("replication_token", ["--replication-token", "t"], "t"),
    ("replication_token_file", ["--replication-token-file", "t.file"], Path("t.file")),
    ("object_store_url", ["--object-store", "file:///objects"], "file:///objects"),
    ("tier_delete_grace_ms", ["--tier-delete-grace-ms", "16"], 16),
    (
        "listeners",
        ["--listener", "external=0.0.0.0:9094", "--advertised-listener", "external=n1:31000"],
        (ListenerSettings("external", "0.0.0.0", 9094, "n1", 31000),),
    ),
]


@pytest.fixture(autouse=True)
def _no_broker_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HEADRACE_REPLICATION_TOKEN", "HEADRACE_RACK"):
        monkeypatch.delenv(name, raising=False)


def _settings(*argv: str) -> BrokerSettings:
    mode = [] if "--cluster" in argv else ["--standalone"]
    ctx = broker.make_context("broker", ["--data-dir", "d", *mode, *argv])
    return broker_settings(ctx.params)


def _get(settings: BrokerSettings, path: str) -> Any:
    value: Any = settings
    for part in path.split("."):
        value = getattr(value, part)
    return value


def test_the_options_and_their_defaults_are_the_ones_before() -> None:
    ctx = click.Context(broker)
    now = [
        (
            p.opts[0],
            p.name,
            None if p.required or p.multiple else p.get_default(ctx),
            p.envvar,
        )
        for p in broker.params
    ]
    assert now == OPTIONS_BEFORE


def test_help_lists_the_same_options_as_before() -> None:
    result = CliRunner().invoke(broker, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    listed = re.findall(r"^  (--[\w-]+)", result.output, re.M)
    assert listed == [flag for flag, *_ in OPTIONS_BEFORE] + ["--help"]


def test_every_setting_settable_before_still_is() -> None:
    covered = {path.split(".")[0] for path, _, _ in SETTABLE_BEFORE}
    defaults = BrokerSettings(data_dir=Path("d"))
    # the settings the command line never set keep their defaults
    unset = {f for f in BrokerSettings.__dataclass_fields__ if f not in covered}
    assert unset == {
        "max_frame_bytes",
        "delivery_chunk_bytes",
        "tier_object_max_bytes",
        "tier_upload_threshold_bytes",
        "seal_ack_wait_ms",
    }
    plain = _settings()
    assert all(getattr(plain, f) == getattr(defaults, f) for f in unset)


@pytest.mark.parametrize(("path", "argv", "expected"), SETTABLE_BEFORE, ids=lambda v: str(v))
def test_each_flag_sets_its_setting(path: str, argv: list[str], expected: Any) -> None:
    assert _get(_settings(*argv), path) == expected


def test_the_environment_sets_the_token_and_the_rack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADRACE_REPLICATION_TOKEN", "from-env")
    monkeypatch.setenv("HEADRACE_RACK", "zone-b")
    settings = _settings()
    assert (settings.replication_token, settings.rack) == ("from-env", "zone-b")
    monkeypatch.setenv("HEADRACE_RACK", "")
    assert _settings().rack is None


def test_a_token_file_replaces_the_token_and_defaults_hold() -> None:
    settings = _settings("--replication-token", "t", "--replication-token-file", "f")
    assert (settings.replication_token, settings.replication_token_file) == (None, Path("f"))
    plain = _settings()
    assert (plain.cluster_id, plain.tls, plain.admin_tls, plain.cluster_mode) == (
        "standalone",
        None,
        None,
        False,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cluster", "--standalone"], "choose one of --standalone or --cluster"),
        (["--tls-cert", "c"], "--tls-cert and --tls-key go together"),
        (["--admin-tls-key", "k"], "--admin-tls-cert and --admin-tls-key go together"),
    ],
)
def test_mismatched_options_are_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(click.UsageError, match=message):
        _settings(*argv)
    neither = broker.make_context("broker", ["--data-dir", "d"])
    with pytest.raises(click.UsageError, match="choose one"):
        broker_settings(neither.params)


def test_listeners_take_hosts_with_or_without_an_advertised_address() -> None:
    settings = _settings(
        "--listener", "external=127.0.1.2:0",
        "--listener", "v6=[::1]:9095",
        "--advertised-listener", "v6=[fd00::1]",
        "--listener", "lb=0.0.0.0:9096",
        "--advertised-listener", "lb=lb.example:443",
    )  # fmt: skip
    assert settings.listeners == (
        ListenerSettings("external", "127.0.1.2", 0),
        ListenerSettings("v6", "::1", 9095, "fd00::1", None),
        ListenerSettings("lb", "0.0.0.0", 9096, "lb.example", 443),
    )
    assert _settings().listeners == ()
    per_broker = _settings(
        "--broker-id", "2",
        "--listener", "external=10.0.0.5:9094",
        "--advertised-listener", "external=192.168.1.9:31000+id",
    )  # fmt: skip
    assert per_broker.listeners == (
        ListenerSettings("external", "10.0.0.5", 9094, "192.168.1.9", 31002),
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--listener", "external"], "expected NAME=HOST:PORT"),
        (["--listener", "=h:1"], "expected NAME=HOST:PORT"),
        (["--listener", "external=h"], "expected HOST:PORT"),
        (["--listener", "external=h:port"], "the port must be 0..65535"),
        (["--listener", "external=h:70000"], "the port must be 0..65535"),
        (["--listener", "internal=h:1"], "the default listener"),
        (["--listener", "a=h:1", "--listener", "a=h:2"], "given twice"),
        (["--advertised-listener", "a=h:1"], "no --listener of that name"),
        (["--listener", "a=h:+id"], "the port must be 0..65535"),
        (
            ["--listener", "a=h:1", "--advertised-listener", "a=h:65535+id", "--broker-id", "1"],
            "the port must be 0..65535",
        ),
        (
            ["--listener", "a=h:1", "--advertised-listener", "a=x", "--advertised-listener", "a=y"],
            "advertised twice",
        ),
    ],
)
def test_a_bad_listener_is_a_bad_parameter(argv: list[str], message: str) -> None:
    with pytest.raises(click.BadParameter, match=message):
        _settings(*argv)


def test_a_listener_serves_its_own_certificate_with_the_data_ports_checks() -> None:
    settings = _settings(
        "--tls-cert", "/tls/tls.crt",
        "--tls-key", "/tls/tls.key",
        "--tls-client-ca", "/tls/ca.crt",
        "--listener", "external=0.0.0.0:9094",
        "--listener", "other=0.0.0.0:9095",
        "--listener-tls-cert", "external=/outside/tls.crt",
        "--listener-tls-key", "external=/outside/tls.key",
    )  # fmt: skip
    external, other = settings.listeners
    assert settings.tls is not None and external.tls is not None
    assert (external.tls.cert_file, external.tls.key_file) == (
        Path("/outside/tls.crt"),
        Path("/outside/tls.key"),
    )
    assert external.tls.client_ca_file == settings.tls.client_ca_file == Path("/tls/ca.crt")
    assert other.tls is None  # the data port's certificate


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--listener-tls-cert", "nope=/c", "--listener-tls-key", "nope=/k"], "no --listener"),
        (["--listener-tls-cert", "external=/c"], "go together"),
        (
            ["--listener-tls-cert", "external=/c", "--listener-tls-cert", "external=/d"],
            "given twice",
        ),
    ],
)
def test_a_bad_listener_certificate_is_refused(argv: list[str], message: str) -> None:
    base = ["--tls-cert", "/t.crt", "--tls-key", "/t.key", "--listener", "external=h:1"]
    with pytest.raises(click.UsageError, match=message):
        _settings(*base, *argv)
    with pytest.raises(click.UsageError, match="needs --tls-cert"):
        _settings(
            "--listener",
            "external=h:1",
            "--listener-tls-cert",
            "external=/c",
            "--listener-tls-key",
            "external=/k",
        )
