"""Local-mode CLI pieces for unloads and the object store: no processes started."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from click.testing import CliRunner

from headrace.cli import local, local_cluster, local_record, local_status


def test_a_directory_store_is_shared_and_needs_no_secrets(tmp_path: Path) -> None:
    args, env = local_cluster.object_store_args({"object_store": "dir"}, tmp_path)
    assert args == [
        "--object-store",
        f"file://{(tmp_path / 'objects').resolve()}",
        "--cluster-id",
        "local",
    ]
    assert env == {}
    assert (tmp_path / "objects").is_dir()


def test_minio_credentials_go_to_the_environment_never_the_command_line(tmp_path: Path) -> None:
    record = {
        "minio": {
            "host": "127.0.0.1",
            "port": 9123,
            "bucket": "headrace",
            "access_key": "AK-secret-ish",
            "secret_key": "SK-very-secret",
        }
    }
    args, env = local_cluster.object_store_args(record, tmp_path)
    assert "--object-store" in args
    assert args[args.index("--object-store") + 1] == (
        "s3://127.0.0.1:9123/headrace?create_bucket=1"
    )
    assert not any("secret" in a.lower() or "AK-" in a for a in args)
    assert env == {
        "HEADRACE_OBJECT_STORE_ACCESS_KEY": "AK-secret-ish",
        "HEADRACE_OBJECT_STORE_SECRET_KEY": "SK-very-secret",
    }


def test_the_state_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "local.json"
    local_record.write_state(path, {"minio": {"secret_key": "x"}})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert json.loads(path.read_text()) == {"minio": {"secret_key": "x"}}


def test_broker_command_lines(tmp_path: Path) -> None:
    b = {"id": 2, "host": "127.0.0.4", "port": 9092, "admin_port": 9644}
    assert local_cluster.broker_args(b, tmp_path, "always") == [
        "broker",
        "--cluster",
        "--broker-id",
        "2",
        "--host",
        "127.0.0.4",
        "--port",
        "9092",
        "--admin-host",
        "127.0.0.4",
        "--admin-port",
        "9644",
        "--data-dir",
        str(tmp_path / "broker-2"),
        "--fsync",
        "always",
    ]


def test_status_lines_show_each_move() -> None:
    unloads = [
        {
            "metadata": {"name": "move", "namespace": "default"},
            "spec": {"topicRef": {"name": "orders"}, "partitions": [0, 1], "targetBroker": 1},
            "status": {
                "phase": "Moving",
                "conditions": [{"type": "Ready", "message": "1 of 2 partition(s) moved"}],
                "moves": [
                    {
                        "partition": 0,
                        "phase": "Completed",
                        "fromBroker": 0,
                        "toBroker": 1,
                        "sealedOffset": 21,
                        "verification": {"result": "Passed"},
                    },
                    {
                        "partition": 1,
                        "phase": "Sealed",
                        "fromBroker": 2,
                        "toBroker": 1,
                        "recovery": {"source": "ObjectStore", "message": "owner 2 died"},
                    },
                ],
            },
        },
        {
            "metadata": {"name": "new", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"topicRef": {"name": "orders"}},
        },
    ]
    assert local_status.unload_lines(unloads) == [
        "unload default/move  topic orders  Moving  target 1  1 of 2 partition(s) moved",
        "    0  Completed  0 -> 1  sealed 21  verified Passed",
        "    1  Sealed     2 -> 1  sealed -  recovery ObjectStore: owner 2 died",
        "unload default/new  topic orders  Pending  (deleting)",
    ]


def test_controller_flags_are_checked() -> None:
    runner = CliRunner()
    result = runner.invoke(
        local.controller,
        ["--state-dir", "x", "--broker", "0=h:1", "--unload-recovery-timeout-ms", "0"],
    )
    assert result.exit_code == 2
    assert "unload_recovery_timeout_ms must be positive" in result.output
    result = runner.invoke(local.controller, ["--help"])
    assert "--unload-recovery-timeout-ms" in result.output
    assert "--transition-poll-interval-ms" in result.output


def test_local_up_offers_both_object_stores() -> None:
    result = CliRunner().invoke(local.local, ["up", "--help"])
    assert "--object-store [dir|minio]" in result.output
