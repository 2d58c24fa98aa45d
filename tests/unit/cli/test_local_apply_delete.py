"""``headrace apply|delete -f`` against a real controller HTTP surface over scripted brokers.

The controller's admin app runs on a loopback port in a thread of its own; the
CLI commands run through click's test runner, as a user would type them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner, Result

import headrace.cli.main  # noqa: F401 -- registers the snapshot kinds, as `headrace` does
from headrace.cli import local
from headrace.controller.admin import ControllerAdmin
from tests.unit.controller.controller_fakes import ScriptedController, make


def topic_yaml(name: str, replicas: int = 1, cluster: str = "local", extra: str = "") -> str:
    return f"""apiVersion: headrace.dev/v1alpha1
kind: Topic
metadata: {{name: {name}}}
spec: {{clusterRef: {{name: {cluster}}}, partitions: 2, replicas: {replicas}, minInSync: 1{extra}}}
"""


BROKER_CLUSTER = """apiVersion: headrace.dev/v1alpha1
kind: BrokerCluster
metadata: {name: main}
spec: {replicas: 3}
"""


class Served:
    def __init__(self, controller: ScriptedController, url: str) -> None:
        self.controller = controller
        self.url = url


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    controller = make(tmp_path / "controller")
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port: list[int] = []
    runner = web.AppRunner(ControllerAdmin(controller).app)

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port.append(runner.addresses[0][1])

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield Served(controller, f"http://127.0.0.1:{port[0]}")
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def cli(command: object, *args: str) -> Result:
    return CliRunner().invoke(command, list(args))  # type: ignore[arg-type]


def test_apply_of_a_directory_skips_other_kinds_and_refuses_what_cannot_run(
    served: Served, tmp_path: Path
) -> None:
    folder = tmp_path / "manifests"
    folder.mkdir()
    (folder / "a-cluster.yaml").write_text(BROKER_CLUSTER)
    (folder / "b-fine.yaml").write_text(topic_yaml("fine"))
    (folder / "c-wide.yml").write_text(
        topic_yaml("wide", replicas=5, extra=", cleanupPolicy: compact")
    )
    (folder / "notes.txt").write_text("not a manifest")
    result = cli(local.apply, "-f", str(folder), "--controller", served.url)
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [
        "skipping BrokerCluster default/main: local mode runs Topics, Unloads, Repartitions,"
        " TopicSnapshots, TopicRestores, TopicSnapshotSchedules only",
        "error: topic default/wide: 5 replicas need 5 brokers, the cluster has 3",
        "error: topic default/wide: cleanupPolicy compact needs scheduled compaction, which"
        " local mode does not run: use delete and run `headrace compact TOPIC"
        " --keep-last-per-key`",
        "nothing applied (--allow-problems applies it anyway)",
    ]
    assert served.controller.resources == {}

    (folder / "c-wide.yml").unlink()
    result = cli(local.apply, "-f", str(folder), "--controller", served.url)
    assert result.exit_code == 0, result.output
    assert result.stdout == "topic default/fine applied\n"
    assert list(served.controller.resources) == ["default/fine"]


def test_allow_problems_turns_them_into_warnings(served: Served, tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(topic_yaml("elsewhere", cluster="main"))
    refused = cli(local.apply, "-f", str(path), "--controller", served.url)
    assert refused.exit_code == 1
    assert (
        "error: topic default/elsewhere: clusterRef 'main' is not this cluster: it is named"
        " 'local'" in refused.stderr
    )
    allowed = cli(local.apply, "-f", str(path), "--controller", served.url, "--allow-problems")
    assert allowed.exit_code == 0, allowed.output
    assert allowed.stderr.startswith("warning: topic default/elsewhere: clusterRef 'main'")
    assert allowed.stdout == "topic default/elsewhere applied\n"


def test_delete_of_what_does_not_exist_says_so_and_exits_3(served: Served, tmp_path: Path) -> None:
    present, absent = tmp_path / "present.yaml", tmp_path / "absent.yaml"
    present.write_text(topic_yaml("present"))
    absent.write_text(topic_yaml("absent"))
    assert cli(local.apply, "-f", str(present), "--controller", served.url).exit_code == 0
    result = cli(local.delete, "-f", str(present), "-f", str(absent), "--controller", served.url)
    assert result.exit_code == local.EXIT_NOT_FOUND == 3
    assert result.stdout == "topic default/present deleted\n"
    assert result.stderr == "topic default/absent not found\n"
    again = cli(local.delete, "-f", str(absent), "--controller", served.url, "--ignore-not-found")
    assert (again.exit_code, again.stderr) == (0, "topic default/absent not found\n")


def test_an_http_error_is_one_line_without_a_python_list(served: Served, tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(topic_yaml("t"))
    result = cli(local.apply, "-f", str(path), "--controller", served.url + "/elsewhere")
    assert result.exit_code == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: HTTP 404 from http://127.0.0.1:") and "[" not in line


def test_apply_reads_standard_input_once(served: Served) -> None:
    result = CliRunner().invoke(
        local.apply, ["-f", "-", "--controller", served.url], input=topic_yaml("piped")
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "topic default/piped applied\n"
