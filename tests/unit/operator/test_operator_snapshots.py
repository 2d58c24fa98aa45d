"""TopicSnapshot and TopicRestore handlers against kmock's API server (``kube_server``): the
Jobs they create, the statuses and Events they write, the finalizer's Job, and that a
restarted operator (a new ``OperatorContext``, nothing in memory) picks each one up where
the stored objects say it is, without a second Job or a second Topic.

The Jobs' pods do not run here (``e2e/tests/operator/test_snapshot_e2e.py`` runs them):
a test marks a Job finished and gives it a pod whose termination message is the summary
``cli.snapshots`` writes.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import kopf
import pytest
from kube_server import ApiServer

from headrace.cli import snapshots as cli_snapshots
from headrace.cli.snapshots import snapshot_summary
from headrace.control import snapshot_schedules
from headrace.control.documents import RESTORE_ANNOTATION, RESTORE_SNAPSHOT_ANNOTATION
from headrace.jobs.topics import TopicRef
from headrace.operator import snapshot_handlers, snapshot_jobs
from headrace.operator.handlers import OperatorContext
from headrace.operator.kube import ClientApi
from headrace.operator.workloads import WorkloadSettings
from headrace.protocol.coordination import Heartbeat, PartitionReport
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.tiered.manifest import SegmentObject
from headrace.tiered.snapshots import PartitionCut, Snapshot
from tests.unit.controller.controller_fakes import ManualClock

V = "headrace.dev/v1alpha1"


def cluster() -> dict[str, Any]:
    return {
        "apiVersion": V,
        "kind": "BrokerCluster",
        "metadata": {"name": "demo", "namespace": "ns", "uid": "uid-demo"},
        "spec": {
            "replicas": 2,
            "objectStore": {
                "endpoint": "http://minio:9000",
                "bucket": "tiers",
                "credentialsSecret": {"name": "creds"},
            },
        },
    }


def topic(name: str = "orders", **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": V,
        "kind": "Topic",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", **metadata},
        "spec": {"clusterRef": {"name": "demo"}, "partitions": 2, "replicas": 2},
        "status": {"creationId": f"uid-{name}"},
    }


def topic_snapshot(name: str = "nightly", **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": V,
        "kind": "TopicSnapshot",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1},
        "spec": {"topicRef": {"name": "orders"}},
    }
    if status:
        body["status"] = status
    return body


def topic_restore(
    name: str = "back", target: str = "orders-copy", snapshot: str = "nightly"
) -> dict[str, Any]:
    return {
        "apiVersion": V,
        "kind": "TopicRestore",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1},
        "spec": {"snapshotRef": {"name": snapshot}, "topic": target},
    }


def heartbeat(broker: int, *high_watermarks: int, topic: str = "ns/orders") -> Heartbeat:
    reports = tuple(
        PartitionReport(topic, p, "leader", 1, hw, hw) for p, hw in enumerate(high_watermarks)
    )
    return Heartbeat(BrokerEndpoint(broker, "127.0.0.1"), partitions=reports)


def context_over(
    api: ClientApi, events: list[tuple[str, str, str]], *heartbeats: Heartbeat
) -> OperatorContext:
    """A fresh operator's context: what it knows is only what the API server stores (and
    the latest heartbeats of the cluster's loop, when it runs one)."""

    def post(body: Any, kind: str, reason: str, message: str) -> None:
        events.append((kind, reason, message))

    context = OperatorContext(api=api, clock=ManualClock(), post_event=post)
    if heartbeats:
        beats = {hb.broker_id: hb for hb in heartbeats}
        context.loops[("ns", "demo")] = SimpleNamespace(loop=SimpleNamespace(heartbeats=beats))  # type: ignore[assignment]
    return context


def snapshot_doc(name: str = "nightly") -> Snapshot:
    prefix = "demo/ns/orders/uid-orders"
    parts = tuple(
        PartitionCut(
            p,
            0,
            cut,
            (SegmentObject(0, cut, 100, f"{prefix}/{p}/seg-{p}", 1),),
            {"billing": cut + 1},
        )
        for p, cut in ((0, 41), (1, 16))
    )
    return Snapshot(name, "demo", "ns/orders", "uid-orders", 1_767_225_600_000, parts)


def finish(server: ApiServer, job_name: str, summary: dict[str, Any] | None, ok: bool) -> None:
    """The Job controller's and the kubelet's part: the Job finished, its pod said this."""
    job = server.body("Job", job_name)
    kind = "Complete" if ok else "Failed"
    job["status"] = {"conditions": [{"type": kind, "status": "True", "reason": kind}]}
    server.put(job)
    message = json.dumps(summary) if summary is not None else "Traceback: boom"
    server.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{job_name}-pod",
                "namespace": "ns",
                "labels": {"batch.kubernetes.io/job-name": job_name},
            },
            "status": {
                "containerStatuses": [
                    {
                        "name": "tier",
                        "state": {
                            "terminated": {"finishedAt": "2026-01-01T00:01:00Z", "message": message}
                        },
                    }
                ]
            },
        }
    )


def jobs(server: ApiServer) -> dict[str, dict[str, Any]]:
    return {
        key[2]: dict(obj.raw)
        for key, obj in server.objects.items()
        if (key[0].group, key[0].plural) == ("batch", "jobs") and not obj.deleted
    }


def ready_of(body: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in body["status"]["conditions"] if c["type"] == "Ready")


# ---------------------------------------------------------------------- TopicSnapshot


async def test_a_snapshot_becomes_one_job_cut_at_the_heartbeats_high_watermarks(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(cluster())
    server.put(topic())
    server.put(topic_snapshot())
    events: list[tuple[str, str, str]] = []
    beats = (heartbeat(0, 42, 10), heartbeat(1, 40, 17))  # a follower may be ahead
    await snapshot_handlers.reconcile_snapshot(context_over(api, events, *beats), "ns", "nightly")
    (job,) = jobs(server).values()
    assert job["metadata"]["name"] == "snapshot-nightly"
    (owner,) = job["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "TopicSnapshot",
        "nightly",
        "uid-nightly",
    )
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:4] == ["tier", "snapshot", "ns/orders", "nightly"]
    assert args[args.index("--cuts") + 1] == "0=41,1=16"
    assert args[args.index("--creation-id") + 1] == "uid-orders"
    assert args[args.index("--cluster") + 1] == "demo"
    # the credentials come from the Secret, as the brokers get them: never in the Job
    refs = [e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e]
    assert refs and set(refs) == {"creds"}
    status = server.body("TopicSnapshot", "nightly")["status"]
    assert status["phase"] == "Pending" and status["observedGeneration"] == 1
    assert ready_of(server.body("TopicSnapshot", "nightly"))["status"] == "False"

    # a restarted operator, with other heartbeats now, finds the Job and makes no second one
    later = (heartbeat(0, 90, 30),)
    await snapshot_handlers.reconcile_snapshot(context_over(api, events, *later), "ns", "nightly")
    (again,) = jobs(server).values()
    assert again["spec"]["template"]["spec"]["containers"][0]["args"] == args
    assert events == []  # Pending is no news


async def test_a_snapshot_waits_for_every_partitions_heartbeat(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(cluster())
    server.put(topic())
    server.put(topic_snapshot())
    memo = SimpleNamespace(context=context_over(api, [], heartbeat(0, 42)))  # partition 1 unknown
    with pytest.raises(kopf.TemporaryError, match=r"partitions \[1\]"):
        await snapshot_handlers.snapshot_created(namespace="ns", name="nightly", memo=memo)
    assert jobs(server) == {}
    body = server.body("TopicSnapshot", "nightly")
    assert ready_of(body)["reason"] == "WaitingForBrokers"
    assert {c["type"] for c in body["status"]["conditions"]} == {"Ready"}  # waiting, not stalled


async def test_a_snapshot_of_a_missing_topic_is_stalled(server: ApiServer, api: ClientApi) -> None:
    server.put(cluster())
    server.put(topic_snapshot())
    with pytest.raises(snapshot_handlers.Waiting):
        await snapshot_handlers.reconcile_snapshot(context_over(api, []), "ns", "nightly")
    body = server.body("TopicSnapshot", "nightly")
    assert ready_of(body)["reason"] == "TopicNotFound"
    assert "Stalled" in {c["type"] for c in body["status"]["conditions"]}


async def test_a_finished_job_makes_the_snapshot_ready_with_its_summary(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(cluster())
    server.put(topic())
    server.put(topic_snapshot())
    events: list[tuple[str, str, str]] = []
    context = context_over(api, events, heartbeat(0, 42, 17))
    await snapshot_handlers.reconcile_snapshot(context, "ns", "nightly")
    snap = snapshot_doc()
    finish(server, "snapshot-nightly", snapshot_summary(snap), ok=True)
    await snapshot_handlers.reconcile_snapshot(context, "ns", "nightly")

    body = server.body("TopicSnapshot", "nightly")
    status = body["status"]
    assert status["phase"] == "Ready" and ready_of(body)["status"] == "True"
    assert status["key"] == snap.key and status["creationId"] == "uid-orders"
    assert status["objects"] == 2 and status["bytes"] == 200
    assert status["partitions"] == [
        {"partition": 0, "start": 0, "cut": 41, "objects": 1},
        {"partition": 1, "start": 0, "cut": 16, "objects": 1},
    ]
    assert status["takenAt"] == "2026-01-01T00:00:00.000Z"
    assert [e[:2] for e in events] == [("Normal", "SnapshotReady")]
    # final: no more writes
    version = body["metadata"]["resourceVersion"]
    await snapshot_handlers.reconcile_snapshot(context, "ns", "nightly")
    assert server.body("TopicSnapshot", "nightly")["metadata"]["resourceVersion"] == version


async def test_a_failed_job_fails_the_snapshot_with_its_error(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(cluster())
    server.put(topic())
    server.put(topic_snapshot())
    events: list[tuple[str, str, str]] = []
    context = context_over(api, events, heartbeat(0, 42, 17))
    await snapshot_handlers.reconcile_snapshot(context, "ns", "nightly")
    finish(server, "snapshot-nightly", {"ok": False, "error": "store behind the cut"}, ok=False)
    await snapshot_handlers.reconcile_snapshot(context, "ns", "nightly")
    body = server.body("TopicSnapshot", "nightly")
    assert body["status"]["phase"] == "Failed"
    assert "store behind the cut" in ready_of(body)["message"]
    assert [e[:2] for e in events] == [("Warning", "SnapshotFailed")]


async def test_deleting_a_snapshot_deletes_its_document_through_a_job_first(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(cluster())
    snap = snapshot_doc()
    body = topic_snapshot(phase="Ready", key=snap.key)
    server.put(body)
    events: list[tuple[str, str, str]] = []
    memo = SimpleNamespace(context=context_over(api, events))
    with pytest.raises(kopf.TemporaryError, match="deleting"):
        await snapshot_handlers.snapshot_deleted(body=kopf.Body(body), memo=memo)
    (job,) = jobs(server).values()
    assert job["metadata"]["name"] == "unsnapshot-nightly"
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["tier", "delete-snapshot", "ns/orders", "nightly"]
    assert args[args.index("--creation-id") + 1] == "uid-orders"

    # kopf retries: still running, then done (the finalizer goes: the handler returns)
    with pytest.raises(kopf.TemporaryError):
        await snapshot_handlers.snapshot_deleted(body=kopf.Body(body), memo=memo)
    finish(server, "unsnapshot-nightly", {"ok": True}, ok=True)
    await snapshot_handlers.snapshot_deleted(body=kopf.Body(body), memo=memo)
    assert len(jobs(server)) == 1
    assert [e[:2] for e in events] == [("Normal", "SnapshotDeleted")]


async def test_deleting_a_snapshot_waits_for_its_running_job(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(cluster())
    server.put(topic())
    server.put(topic_snapshot())
    context = context_over(api, [], heartbeat(0, 42, 17))
    await snapshot_handlers.reconcile_snapshot(context, "ns", "nightly")
    body = server.body("TopicSnapshot", "nightly")
    with pytest.raises(snapshot_handlers.Waiting, match="running"):
        await snapshot_handlers.remove_snapshot(context, body)
    assert list(jobs(server)) == ["snapshot-nightly"]  # no delete before the document exists


# ---------------------------------------------------------------------- TopicRestore


def ready_snapshot(server: ApiServer, name: str = "nightly") -> Snapshot:
    snap = snapshot_doc(name)
    server.put(
        topic_snapshot(
            name,
            phase="Ready",
            key=snap.key,
            partitions=[
                {"partition": p.partition, "start": p.start, "cut": p.cut, "objects": 1}
                for p in snap.partitions
            ],
        )
    )
    return snap


async def test_a_restore_creates_a_held_topic_then_its_job_then_releases_it(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(cluster())
    server.put(topic())
    ready_snapshot(server)
    server.put(topic_restore())
    events: list[tuple[str, str, str]] = []
    await snapshot_handlers.reconcile_restore(context_over(api, events), "ns", "back")

    created = server.body("Topic", "orders-copy")
    assert created["metadata"]["annotations"][RESTORE_ANNOTATION] == "pending"
    assert created["metadata"]["labels"][snapshot_jobs.RESTORE_LABEL] == "back"
    assert created["spec"]["clusterRef"] == {"name": "demo"} and created["spec"]["partitions"] == 2
    uid = created["metadata"]["uid"]
    status = server.body("TopicRestore", "back")["status"]
    assert status["creationId"] == uid and status["phase"] == "Pending"
    (job,) = jobs(server).values()
    assert job["metadata"]["name"] == "restore-back"
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:6] == ["tier", "restore", "ns/orders", "nightly", "--to", "ns/orders-copy"]
    assert args[args.index("--creation-id") + 1] == "uid-orders"
    assert args[args.index("--into-creation-id") + 1] == uid
    # its Spark verification logs to the scratch volume (the root filesystem is read-only)
    assert args[args.index("--dir") + 1].startswith("/tmp/")
    # and needs Java and pyspark: the Spark image, which the broker image has neither of
    container = job["spec"]["template"]["spec"]["containers"][0]
    workload = WorkloadSettings()
    assert (container["image"], container["imagePullPolicy"]) == (
        workload.spark_image,
        workload.spark_image_pull_policy,
    )

    # a restarted operator while the Job runs: the same Topic, the same Job
    await snapshot_handlers.reconcile_restore(context_over(api, events), "ns", "back")
    assert server.body("Topic", "orders-copy")["metadata"]["uid"] == uid
    assert list(jobs(server)) == ["restore-back"]

    finish(server, "restore-back", {"ok": True, "objects": 2, "bytes": 200}, ok=True)
    await snapshot_handlers.reconcile_restore(context_over(api, events), "ns", "back")
    released = server.body("Topic", "orders-copy")
    assert released["metadata"]["annotations"][RESTORE_ANNOTATION] == "written"
    status = server.body("TopicRestore", "back")["status"]
    assert status["phase"] == "Pending" and status["objects"] == 2 and status["bytes"] == 200

    # the control loop places it: the restore is Ready
    placed = {"type": "Ready", "status": "True", "reason": "Placed"}
    placed["lastTransitionTime"] = "2026-01-01T00:00:00Z"
    released["status"] = {"conditions": [placed]}
    server.put(released)
    await snapshot_handlers.reconcile_restore(context_over(api, events), "ns", "back")
    body = server.body("TopicRestore", "back")
    assert body["status"]["phase"] == "Ready" and ready_of(body)["status"] == "True"
    assert body["status"]["completedAt"]
    assert [e[:2] for e in events] == [("Normal", "RestoreReady")]


async def test_a_restore_waits_for_its_snapshot(server: ApiServer, api: ClientApi) -> None:
    server.put(cluster())
    server.put(topic())
    server.put(topic_snapshot(phase="Pending"))
    server.put(topic_restore())
    memo = SimpleNamespace(context=context_over(api, []))
    with pytest.raises(kopf.TemporaryError, match="not Ready"):
        await snapshot_handlers.restore_created(namespace="ns", name="back", memo=memo)
    assert ready_of(server.body("TopicRestore", "back"))["reason"] == "WaitingForSnapshot"
    assert "orders-copy" not in {name for (resource, _, name) in server.objects}


async def restore_job_started(server: ApiServer, api: ClientApi) -> Any:
    """A TopicRestore of a Ready snapshot, reconciled once: its Job created."""
    server.put(cluster())
    server.put(topic())
    ready_snapshot(server)
    server.put(topic_restore())
    context = context_over(api, [])
    await snapshot_handlers.reconcile_restore(context, "ns", "back")
    return context


async def test_a_restore_into_a_topic_it_did_not_create_fails(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(cluster())
    server.put(topic())
    server.put(topic("orders-copy"))
    ready_snapshot(server)
    server.put(topic_restore())
    events: list[tuple[str, str, str]] = []
    await snapshot_handlers.reconcile_restore(context_over(api, events), "ns", "back")
    body = server.body("TopicRestore", "back")
    assert body["status"]["phase"] == "Failed" and ready_of(body)["reason"] == "TopicExists"
    assert jobs(server) == {}
    assert "annotations" not in server.body("Topic", "orders-copy")["metadata"]
    assert [e[:2] for e in events] == [("Warning", "RestoreFailed")]


async def test_a_failed_restore_job_leaves_the_topic_held(
    server: ApiServer, api: ClientApi
) -> None:
    context = await restore_job_started(server, api)
    finish(server, "restore-back", {"ok": False, "error": "failed verification"}, ok=False)
    await snapshot_handlers.reconcile_restore(context, "ns", "back")
    body = server.body("TopicRestore", "back")
    assert body["status"]["phase"] == "Failed"
    assert "failed verification" in ready_of(body)["message"]
    held = server.body("Topic", "orders-copy")
    assert held["metadata"]["annotations"][RESTORE_ANNOTATION] == "pending"


async def test_a_restore_of_another_snapshot_into_a_pending_topic_is_refused_naming_both(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(cluster())
    server.put(topic())
    nightly = ready_snapshot(server)
    hourly = ready_snapshot(server, "hourly")
    server.put(topic_restore())
    await snapshot_handlers.reconcile_restore(context_over(api, []), "ns", "back")
    held = server.body("Topic", "orders-copy")
    assert held["metadata"]["annotations"][RESTORE_SNAPSHOT_ANNOTATION] == nightly.key
    assert held["metadata"]["labels"][snapshot_jobs.RESTORE_LABEL] == "back"

    server.put(topic_restore("again", snapshot="hourly"))
    events: list[tuple[str, str, str]] = []
    await snapshot_handlers.reconcile_restore(context_over(api, events), "ns", "again")
    body = server.body("TopicRestore", "again")
    assert body["status"]["phase"] == "Failed" and ready_of(body)["reason"] == "TopicExists"
    message = ready_of(body)["message"]
    assert "nightly of ns/orders" in message and "hourly of ns/orders" in message
    assert "TopicRestore 'back'" in message
    assert list(jobs(server)) == ["restore-back"]  # no Job of the second
    assert nightly.key != hourly.key
    assert server.body("Topic", "orders-copy")["metadata"] == held["metadata"]


VERIFY_REPORT = "demo/ns/orders-copy/uid-orders-copy/reports/verify-1767225600000.json"


def verify_report(*, findings: list[dict[str, Any]], verified: list[int]) -> dict[str, Any]:
    """The report ``jobs/run.py verify`` hands the restore (its copy is in the store)."""
    return {
        "ok": not findings,
        "summary": {"partitions": len(verified), "errors": len(findings), "objects": 2},
        "findings": findings,
        "failed": [],
        "partitions": [{"partition": p} for p in verified],
        "reportKey": VERIFY_REPORT,
    }


def restore_pod_summary(tmp_path: Path, run: Any) -> dict[str, Any]:
    """What a restore Job's pod writes to its termination message when ``run`` is its work."""
    result = tmp_path / "termination-log"
    with contextlib.suppress(click.ClickException):
        cli_snapshots._reporting(result, run)
    return dict(json.loads(result.read_text()))


async def test_a_verified_restore_says_where_its_verify_report_is(
    server: ApiServer, api: ClientApi, tmp_path: Path
) -> None:
    context = await restore_job_started(server, api)
    target = TopicRef("demo", "ns/orders-copy", "uid-orders-copy")
    verdict = cli_snapshots.verification_of(
        target, [0, 1], 0, verify_report(findings=[], verified=[0, 1]), tmp_path / "verify.log"
    )
    summary = restore_pod_summary(
        tmp_path,
        lambda: {
            "ok": True,
            "objects": 2,
            "bytes": 200,
            "verification": cli_snapshots.verification_summary(verdict),
        },
    )
    finish(server, "restore-back", summary, ok=True)
    await snapshot_handlers.reconcile_restore(context, "ns", "back")
    status = server.body("TopicRestore", "back")["status"]
    assert status["verification"] == {"outcome": "Verified", "reportKey": VERIFY_REPORT}

    released = server.body("Topic", "orders-copy")
    placed = {"type": "Ready", "status": "True", "reason": "Placed"}
    released["status"] = {"conditions": [{**placed, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    server.put(released)
    await snapshot_handlers.reconcile_restore(context, "ns", "back")
    status = server.body("TopicRestore", "back")["status"]
    assert status["phase"] == "Ready"
    assert status["verification"] == {"outcome": "Verified", "reportKey": VERIFY_REPORT}


async def test_a_restore_that_fails_verification_says_why_and_where_its_report_is(
    server: ApiServer, api: ClientApi, tmp_path: Path
) -> None:
    context = await restore_job_started(server, api)
    target = TopicRef("demo", "ns/orders-copy", "uid-orders-copy")
    crc = {
        "kind": "crc",
        "partition": 1,
        "key": "demo/ns/orders-copy/uid-orders-copy/1/seg-1",
        "offset": 7,
        "message": "CRC mismatch",
        "severity": "error",
    }
    report = verify_report(findings=[crc], verified=[1])

    def verify() -> dict[str, Any]:
        verdict = cli_snapshots.verification_of(target, [0, 1], 3, report, tmp_path / "v.log")
        raise cli_snapshots.RestoreNotVerified(verdict)

    finish(server, "restore-back", restore_pod_summary(tmp_path, verify), ok=False)
    await snapshot_handlers.reconcile_restore(context, "ns", "back")
    body = server.body("TopicRestore", "back")
    assert body["status"]["phase"] == "Failed"
    verification = body["status"]["verification"]
    assert (verification["outcome"], verification["reportKey"]) == ("Failed", VERIFY_REPORT)
    assert "CRC mismatch" in verification["reason"]
    assert "partition 0: not verified" in verification["reason"]
    assert "CRC mismatch" in ready_of(body)["message"]
    held = server.body("Topic", "orders-copy")
    assert held["metadata"]["annotations"][RESTORE_ANNOTATION] == "pending"


async def test_a_restore_whose_verify_job_could_not_run_has_no_report_to_name(
    server: ApiServer, api: ClientApi, tmp_path: Path
) -> None:
    context = await restore_job_started(server, api)
    target = TopicRef("demo", "ns/orders-copy", "uid-orders-copy")

    def verify() -> dict[str, Any]:
        log = tmp_path / "verify.log"
        raise cli_snapshots.RestoreNotVerified(
            cli_snapshots.verification_of(target, [0, 1], 1, None, log)
        )

    finish(server, "restore-back", restore_pod_summary(tmp_path, verify), ok=False)
    await snapshot_handlers.reconcile_restore(context, "ns", "back")
    verification = server.body("TopicRestore", "back")["status"]["verification"]
    assert verification["outcome"] == "Failed" and "reportKey" not in verification
    assert "could not run" in verification["reason"]


# ---------------------------------------------------------------------- TopicSnapshotSchedule

JAN_1_0200 = 1_767_232_800_000  # 2026-01-01T02:00:00Z


def schedule(name: str = "sched", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": V,
        "kind": "TopicSnapshotSchedule",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"topicRef": {"name": "orders"}, "schedule": "0 2 * * *", "keep": 2, **spec},
    }


def scheduled(name: str, phase: str | None, message: str = "") -> dict[str, Any]:
    body = topic_snapshot(name)
    body["metadata"]["labels"] = {snapshot_schedules.SCHEDULE_LABEL: "sched"}
    if phase is not None:
        # as the API server admits it (a condition has its reason and transition time)
        ready = {
            "type": "Ready",
            "status": str(phase == "Ready"),
            "reason": phase,
            "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        body["status"] = {"phase": phase, "conditions": [ready]}
    return body


def schedule_context(api: ClientApi, events: list[tuple[str, str, str]], now_ms: int) -> Any:
    context = context_over(api, events)
    context.clock = ManualClock(now_ms)
    return context


def snapshot_names(server: ApiServer) -> list[str]:
    return sorted(
        name
        for (resource, _, name), obj in server.objects.items()
        if resource.plural == "topicsnapshots" and not obj.deleted
    )


async def test_a_schedule_takes_the_snapshot_that_is_due_once(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(schedule())
    events: list[tuple[str, str, str]] = []
    before = schedule_context(api, events, JAN_1_0200 - 1000)
    await snapshot_handlers.reconcile_schedule(before, "ns", "sched")
    assert snapshot_names(server) == []

    at = schedule_context(api, events, JAN_1_0200 + 5000)
    await snapshot_handlers.reconcile_schedule(at, "ns", "sched")
    assert snapshot_names(server) == ["sched-202601010200"]
    taken = server.body("TopicSnapshot", "sched-202601010200")
    assert taken["metadata"]["labels"] == {snapshot_schedules.SCHEDULE_LABEL: "sched"}
    assert taken["spec"] == {"topicRef": {"name": "orders"}}
    assert "ownerReferences" not in taken["metadata"]  # deleting the schedule keeps it
    status = server.body("TopicSnapshotSchedule", "sched")["status"]
    assert status["lastScheduleTime"] == "2026-01-01T02:00:00.000Z"
    assert status["lastSnapshot"] == {"name": "sched-202601010200"}
    assert [e[1] for e in events] == ["SnapshotScheduled"]

    # the next tick, and a restarted operator's: nothing more until tomorrow's 02:00
    for _ in range(2):
        later = schedule_context(api, events, JAN_1_0200 + 60_000)
        await snapshot_handlers.reconcile_schedule(later, "ns", "sched")
    assert snapshot_names(server) == ["sched-202601010200"]
    assert len(events) == 1
    done = server.body("TopicSnapshot", "sched-202601010200")
    done["status"] = {"phase": "Ready"}
    server.put(done)
    tomorrow = schedule_context(api, events, JAN_1_0200 + 86_400_000)
    await snapshot_handlers.reconcile_schedule(tomorrow, "ns", "sched")
    assert snapshot_names(server) == ["sched-202601010200", "sched-202601020200"]


async def test_a_schedule_keeps_its_newest_ready_snapshots_and_its_last_failure(
    server: ApiServer, api: ClientApi
) -> None:
    server.put(schedule(suspend=True))
    for day, phase in ((1, "Ready"), (2, "Failed"), (3, "Ready"), (4, "Ready"), (5, "Failed")):
        server.put(scheduled(f"sched-2026010{day}0200", phase, message=f"day {day}"))
    server.put(scheduled("sched-202601060200", None))  # pending: left alone
    server.put(topic_snapshot("by-hand"))  # not the schedule's
    context = schedule_context(api, [], JAN_1_0200 + 6 * 86_400_000)
    await snapshot_handlers.reconcile_schedule(context, "ns", "sched")

    assert snapshot_names(server) == [
        "by-hand",
        "sched-202601030200",
        "sched-202601040200",
        "sched-202601050200",
        "sched-202601060200",
    ]
    body = server.body("TopicSnapshotSchedule", "sched")
    status = body["status"]
    assert status["kept"] == [{"name": "sched-202601030200"}, {"name": "sched-202601040200"}]
    assert status["lastSnapshot"] == {"name": "sched-202601060200"}
    assert status["lastFailure"] == "sched-202601050200: day 5"
    assert (ready_of(body)["status"], ready_of(body)["reason"]) == ("False", "LastSnapshotFailed")
    assert "lastScheduleTime" not in status  # suspended: it took none


async def test_a_suspended_schedule_takes_none(server: ApiServer, api: ClientApi) -> None:
    server.put(schedule(suspend=True))
    context = schedule_context(api, [], JAN_1_0200 + 5000)
    await snapshot_handlers.reconcile_schedule(context, "ns", "sched")
    assert snapshot_names(server) == []
    assert ready_of(server.body("TopicSnapshotSchedule", "sched"))["reason"] == "Suspended"


async def test_a_due_time_is_skipped_while_the_last_snapshot_is_not_done(
    server: ApiServer, api: ClientApi
) -> None:
    # a topic that cannot be snapshotted must not pile up a pending snapshot a tick
    server.put(schedule())
    server.put(scheduled("sched-202512310200", "Pending"))
    events: list[tuple[str, str, str]] = []
    context = schedule_context(api, events, JAN_1_0200 + 5000)
    await snapshot_handlers.reconcile_schedule(context, "ns", "sched")
    assert snapshot_names(server) == ["sched-202512310200"]
    assert [e[:2] for e in events] == [("Warning", "SnapshotSkipped")]
    status = server.body("TopicSnapshotSchedule", "sched")["status"]
    assert status["lastScheduleTime"] == "2026-01-01T02:00:00.000Z"  # skipped, not owed
