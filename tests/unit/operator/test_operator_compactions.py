"""Compaction -> Job and CompactionSchedule -> CronJob (pure builders and statuses), and the
reconciler over a fake ``KubeApi``: the Job it creates, a run that waits for another,
the status from the Job and its pod's termination message."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from operator_fakes import FakeApi

from headrace.cli.jobs import result_summary
from headrace.operator import compaction_handlers, compaction_jobs, handlers, workloads
from headrace.operator.bodies import parse_cluster, parse_compaction, parse_topic
from headrace.operator.kube import ObjectRef
from headrace.resources.compactions import Compaction, CompactionPhase, CompactionSchedule
from tests.unit.controller.controller_fakes import ManualClock

NOW = "2026-01-01T00:00:00Z"
V = "headrace.dev/v1alpha1"


def topic_body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": V,
        "kind": "Topic",
        "metadata": {"name": "orders", "namespace": "ns"},
        "spec": {"clusterRef": {"name": "demo"}, "partitions": 2, "replicas": 1, **spec},
    }


def cluster_body(store: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {"replicas": 1, "brokerConfig": {"segmentBytes": 4096}}
    if store:
        spec["objectStore"] = {
            "endpoint": "http://127.0.0.1:9000",
            "bucket": "tiers",
            "credentialsSecret": {"name": "creds"},
        }
    return {
        "apiVersion": V,
        "kind": "BrokerCluster",
        "metadata": {"name": "demo", "namespace": "ns"},
        "spec": spec,
    }


def compaction_body(name: str = "once", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": V,
        "kind": "Compaction",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1},
        "spec": {"topicRef": {"name": "orders"}, **spec},
    }


def schedule_body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": V,
        "kind": "CompactionSchedule",
        "metadata": {"name": "nightly", "namespace": "ns", "uid": "uid-s", "generation": 1},
        "spec": {"topicRef": {"name": "orders"}, "schedule": "*/1 * * * *", **spec},
    }


SETTINGS = workloads.WorkloadSettings(broker_command=("python", "-m", "headrace.cli.main"))


def run_target(**topic_spec: Any) -> compaction_jobs.Target:
    spec = Compaction.from_manifest(compaction_body()).spec
    return compaction_jobs.target(
        "ns", spec.topic_ref, parse_topic(topic_body(**topic_spec)), parse_cluster(cluster_body())
    )


def test_a_compaction_becomes_a_job_owned_by_it() -> None:
    compaction = Compaction.from_manifest(
        compaction_body(partitions=[1, 0], sparkConf={"spark.driver.memory": "1g"})
    )
    job = compaction_jobs.job_manifest(compaction, "uid-once", run_target(), SETTINGS)
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"]) == ("batch/v1", "Job", "once")
    (owner,) = job["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Compaction", "once", "uid-once")
    assert job["spec"]["backoffLimit"] == 2
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "headrace.cli.main"]
    args = container["args"]
    assert args[:2] == ["compact", "ns/orders"]
    assert args[args.index("--store") + 1] == "s3://127.0.0.1:9000/tiers"
    assert args[args.index("--cluster") + 1] == "demo"
    assert args[args.index("--target-bytes") + 1] == "4096"  # the cluster's segment size
    assert args[args.index("--partitions") + 1] == "0,1"
    assert args[args.index("--result-file") + 1] == container["terminationMessagePath"]
    assert args[args.index("--conf") + 1] == "spark.driver.memory=1g"
    assert "--verify" in args and "--keep-last-per-key" not in args
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert env[workloads.ACCESS_KEY_ENV] == {"name": "creds", "key": "accessKey"}


def test_a_key_compacted_topic_keeps_the_last_record_per_key() -> None:
    compaction = Compaction.from_manifest(compaction_body(verify=False, targetSegmentBytes=99))
    run = run_target(cleanupPolicy="compact", segments={"bytes": 1000})
    args = compaction_jobs.job_args(compaction.spec, run)
    assert "--keep-last-per-key" in args and "--no-verify" in args
    assert args[args.index("--target-bytes") + 1] == "99"


def test_the_job_reads_the_topics_incarnation_or_the_legacy_layout_without_one() -> None:
    spec = Compaction.from_manifest(compaction_body()).spec
    placed = {**topic_body(), "status": {"creationId": "uid-topic"}}
    run = compaction_jobs.target(
        "ns", spec.topic_ref, parse_topic(placed), parse_cluster(cluster_body())
    )
    args = compaction_jobs.job_args(spec, run)
    assert args[args.index("--creation-id") + 1] == "uid-topic"
    # a topic placed before creation ids: its objects are where they always were
    assert "--creation-id" not in compaction_jobs.job_args(spec, run_target())


@pytest.mark.parametrize(
    ("topic", "cluster", "reason"),
    [
        (None, cluster_body(), "TopicNotFound"),
        (topic_body(), None, "ClusterNotFound"),
        (topic_body(), cluster_body(store=False), "NoObjectStore"),
        (topic_body(tieredStorage={"enabled": False}), cluster_body(), "NotTiered"),
    ],
)
def test_a_run_without_a_target_says_why(
    topic: dict[str, Any] | None, cluster: dict[str, Any] | None, reason: str
) -> None:
    spec = Compaction.from_manifest(compaction_body()).spec
    with pytest.raises(compaction_jobs.NotRunnable) as caught:
        compaction_jobs.target(
            "ns",
            spec.topic_ref,
            None if topic is None else parse_topic(topic),
            None if cluster is None else parse_cluster(cluster),
        )
    assert caught.value.reason == reason


def test_a_schedule_becomes_a_cronjob() -> None:
    schedule = CompactionSchedule.from_manifest(schedule_body(startingDeadlineSeconds=60))
    cron = compaction_jobs.cronjob_manifest(schedule, "uid-s", run_target(), SETTINGS)
    assert cron["kind"] == "CronJob"
    (owner,) = cron["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("CompactionSchedule", "uid-s")
    spec = cron["spec"]
    assert spec["schedule"] == "*/1 * * * *"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (3, 1)
    assert spec["startingDeadlineSeconds"] == 60 and spec["suspend"] is False
    template = spec["jobTemplate"]
    assert template["metadata"]["labels"][compaction_jobs.SCHEDULE_LABEL] == "nightly"
    assert template["spec"]["template"]["spec"]["containers"][0]["args"][0] == "compact"


def pod(message: str, finished: str = "2026-01-01T00:01:00Z") -> dict[str, Any]:
    return {
        "status": {
            "containerStatuses": [
                {
                    "state": {
                        "terminated": {"exitCode": 0, "finishedAt": finished, "message": message}
                    }
                }
            ]
        }
    }


def job(*conditions: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {"status": {"conditions": list(conditions), **status}}


SUMMARY = {
    "job": "compact",
    "ok": True,
    "verified": True,
    "mismatches": 0,
    "segmentsBefore": 12,
    "segmentsAfter": 2,
    "bytesReclaimed": 0,
    "reportKey": "demo/ns/orders/reports/compact-1.json",
}


def test_run_states_follow_the_job() -> None:
    assert compaction_jobs.run_state(None, []).phase == CompactionPhase.PENDING
    assert compaction_jobs.run_state(job(active=1), []).phase == CompactionPhase.RUNNING
    done = compaction_jobs.run_state(
        job(
            {"type": "Complete", "status": "True"},
            succeeded=1,
            startTime=NOW,
            completionTime="2026-01-01T00:02:00Z",
        ),
        [pod(json.dumps(SUMMARY))],
    )
    assert done.phase == CompactionPhase.SUCCEEDED
    assert done.attempts == 1 and done.completion_time == "2026-01-01T00:02:00Z"
    assert done.result == {
        "segmentsBefore": 12,
        "segmentsAfter": 2,
        "bytesReclaimed": 0,
        "verified": True,
        "mismatches": 0,
        "report": SUMMARY["reportKey"],
    }
    failed = compaction_jobs.run_state(
        job(
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"},
            failed=3,
        ),
        [pod(json.dumps({"ok": False, "error": "cannot list demo/ns/orders/ in s3://x"}))],
    )
    assert failed.phase == CompactionPhase.FAILED and failed.attempts == 3
    assert "BackoffLimitExceeded" in failed.message and "cannot list" in failed.message
    raw = compaction_jobs.run_state(
        job({"type": "Failed", "status": "True"}), [pod("Traceback: boom")]
    )
    assert "Traceback: boom" in raw.message


def test_the_status_has_a_ready_condition_that_stays_put() -> None:
    state = compaction_jobs.run_state(job(active=1, startTime=NOW), [])
    body = compaction_body()
    parsed = parse_compaction(body)
    running = compaction_jobs.compaction_status(parsed, "once", state, None, NOW)
    assert running["phase"] == "Running" and running["jobName"] == "once"
    (ready,) = running["conditions"]
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == (
        "False",
        "Running",
        1,
    )
    again = compaction_jobs.compaction_status(
        parse_compaction({**body, "status": running}), "once", state, None, "2026-01-01T09:00:00Z"
    )
    assert again == running  # a no-op reconcile writes nothing new
    blocked = compaction_jobs.compaction_status(
        parsed, None, None, compaction_jobs.NotRunnable("TopicNotFound", "no topic"), NOW
    )
    assert [c["type"] for c in blocked["conditions"]] == ["Ready", "Stalled"]
    waiting = compaction_jobs.compaction_status(
        parsed, None, None, compaction_jobs.NotRunnable("WaitingForRun", "busy"), NOW
    )
    assert [c["type"] for c in waiting["conditions"]] == ["Ready"]
    assert waiting["phase"] == "Pending"


def test_the_jobs_summary_fits_a_termination_message() -> None:
    report = {
        "ok": True,
        "reportKey": "k",
        "summary": {"errors": 0, "segmentsBefore": 9, "segmentsAfter": 1, "bytesReclaimed": 5},
        "partitions": [{"verification": {"findings": []}}],
        "failed": [],
        "findings": [{"kind": "x"} for _ in range(1000)],
    }
    summary = result_summary("compact", 0, report)
    assert summary["verified"] is True and summary["segmentsAfter"] == 1
    assert len(json.dumps(summary)) < 4096
    down = result_summary("compact", 2, {"ok": False, "error": "store down", "summary": {}})
    assert down["error"] == "store down" and down["verified"] is False
    assert result_summary("verify", 3, None)["ok"] is False


def memo_over(api: FakeApi) -> Any:
    context = handlers.OperatorContext(api=api, clock=ManualClock(), workload=SETTINGS)
    return SimpleNamespace(context=context)


class JobsApi(FakeApi):
    """The fake API with Jobs (and Compactions) listed too."""

    async def list(
        self, api_version: str, kind: str, namespace: str, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        if kind == "Pod":
            return await super().list(api_version, kind, namespace, label_selector)
        key, _, value = label_selector.partition("=")
        return [
            o
            for r, o in self.objects.items()
            if r.kind == kind and (not key or o["metadata"].get("labels", {}).get(key) == value)
        ]

    async def apply(self, manifest: Any) -> None:
        await super().apply(manifest)
        self.put(manifest)


async def test_the_reconciler_creates_the_job_and_queues_a_second_run() -> None:
    api = JobsApi(topic_body(), cluster_body(), compaction_body("first"), compaction_body("second"))
    memo = memo_over(api)
    await compaction_handlers.compaction_created(namespace="ns", name="first", memo=memo)
    first_job = api.objects[ObjectRef("batch/v1", "Job", "ns", "first")]
    assert first_job["metadata"]["labels"][compaction_jobs.TOPIC_LABEL] == "orders"
    status = api.body("Compaction", "first")["status"]
    assert (status["phase"], status["jobName"]) == ("Pending", "first")

    await compaction_handlers.compaction_created(namespace="ns", name="second", memo=memo)
    assert ObjectRef("batch/v1", "Job", "ns", "second") not in api.objects
    ready = api.body("Compaction", "second")["status"]["conditions"][0]
    assert ready["reason"] == "WaitingForRun" and "first" in ready["message"]

    # the first run's pod wrote its summary and the Job completed: its event reconciles it,
    # which finishes it and starts the waiting one
    api.put({**first_job, "status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    api.pods = [pod(json.dumps(SUMMARY))]
    writes = len(api.writes)
    await compaction_handlers.compaction_job_changed(
        namespace="ns", labels={compaction_jobs.COMPACTION_LABEL: "first"}, memo=memo
    )
    status = api.body("Compaction", "first")["status"]
    assert status["phase"] == "Succeeded" and status["result"]["segmentsAfter"] == 2
    assert status["conditions"][0]["status"] == "True"
    assert ObjectRef("batch/v1", "Job", "ns", "second") in api.objects
    assert len(api.writes) > writes

    # a finished Compaction is final: more events write nothing
    writes = len(api.writes)
    await compaction_handlers.compaction_job_changed(
        namespace="ns", labels={compaction_jobs.COMPACTION_LABEL: "first"}, memo=memo
    )
    assert len(api.writes) == writes


async def test_the_schedule_reconciler_applies_the_cronjob_and_reports_the_last_run() -> None:
    api = JobsApi(topic_body(), cluster_body(), schedule_body())
    memo = memo_over(api)
    await compaction_handlers.schedule_changed(namespace="ns", name="nightly", memo=memo)
    cron = api.objects[ObjectRef("batch/v1", "CronJob", "ns", "nightly")]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    ready = api.body("CompactionSchedule", "nightly")["status"]["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("True", "Scheduled")

    api.put({**cron, "status": {"lastScheduleTime": NOW, "lastSuccessfulTime": NOW}})
    api.put(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": "nightly-29000000",
                "namespace": "ns",
                "labels": {compaction_jobs.SCHEDULE_LABEL: "nightly"},
            },
            "status": {
                "conditions": [{"type": "Complete", "status": "True"}],
                "completionTime": NOW,
            },
        }
    )
    api.pods = [pod(json.dumps(SUMMARY))]
    await compaction_handlers.schedule_run_changed(
        namespace="ns", labels={compaction_jobs.SCHEDULE_LABEL: "nightly"}, memo=memo
    )
    status = api.body("CompactionSchedule", "nightly")["status"]
    assert status["lastScheduleTime"] == NOW and status["lastJob"] == {"name": "nightly-29000000"}
    assert status["lastResult"]["segmentsBefore"] == 12


async def test_a_compaction_the_model_refuses_says_so_in_its_status_and_runs_nothing() -> None:
    """One stored before the CRD's rules refused it: a Stalled status naming the field, never
    a handler that dies (kopf would not call it again) with the object's status silent."""
    api = JobsApi(topic_body(), cluster_body(), compaction_body("bad", graceSeconds=-1))
    await compaction_handlers.compaction_created(namespace="ns", name="bad", memo=memo_over(api))
    assert ObjectRef("batch/v1", "Job", "ns", "bad") not in api.objects
    status = api.body("Compaction", "bad")["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["reason"] == "InvalidSpec"
    assert "graceSeconds" in conditions["Ready"]["message"]
    assert conditions["Stalled"]["status"] == "True"
