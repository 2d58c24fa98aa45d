"""The ``objectstore`` target of the fault campaign: the object store misbehaves under a
tiered topic while the load and the cohort run.

The cluster is a ``headrace local up --object-store minio`` cluster, rearranged before the
topic exists:

- the MinIO that ``local up`` started is killed and started again (same data, same root
  credentials) on another port as a ``MinioServer`` this campaign can kill and restart;
- a ``FaultProxy`` takes MinIO's old port, so the brokers reach MinIO only through it;
- the brokers are restarted with an ordinary MinIO user (``TierUser``) whose policy can
  refuse deletes (the root user is above policies).

The topic rolls small segments, uploads every second and keeps little locally, so reads
below the local log start come from the bucket. Each round draws one fault (``FAULTS``)
for a few seconds, then waits until every partition's manifest moves again (uploads
resumed). At the end, besides the campaign's checks of the records (nothing acknowledged
lost, no gap, the cohort got everything), every partition's manifest is read straight from
MinIO: it must parse, have no gap, and every object it lists must be there.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos import campaign
from bench.chaos.faultproxy import FaultProxy, Faults
from bench.chaos.minio_policy import TierUser
from bench.chaos.tiercheck import check_partition
from headrace.jobs.sweep import sweep_topic
from headrace.jobs.topics import TopicRef
from headrace.objectstore.errors import ObjectStoreAccessDenied, ObjectStoreError
from headrace.objectstore.minio_store import MinioSettings, MinioStore
from headrace.testing import procs, waiting
from headrace.testing.minio import MinioServer
from headrace.testing.procs import free_port
from headrace.tiered import layout
from tests.integration.localcluster import LocalCluster, topic_manifest

#: what a round does to the object store
FAULTS = ("throttle", "reset", "hang", "refuse-deletes", "kill-minio")
#: the cluster id of a local cluster (the first part of every key)
CLUSTER_ID = "local"


@dataclass(frozen=True, slots=True)
class StoreFaults:
    #: the faults rounds are drawn from
    kinds: tuple[str, ...] = FAULTS
    #: how long a throttle, reset, hang or refused-deletes round lasts, uniform(min, max) s
    fault_s: tuple[float, float] = (3.0, 10.0)
    #: share of requests answered 503 SlowDown in a throttle round
    slowdown: float = 0.5
    #: shares of requests reset before, and answered then reset after, reaching MinIO
    reset: float = 0.15
    lost_answer: float = 0.15
    #: a hang round holds this share of requests longer than any read timeout of the
    #: brokers' (``open_store``: half the retry deadline, 15 s; at most 60 s)
    hang_share: float = 0.2
    hang_s: float = 65.0
    #: MinIO stays dead uniform(min, max) s in a kill round
    dead_s: tuple[float, float] = (0.5, 5.0)
    #: the sweep's grace period in a refused-deletes round: longer than an upload round
    sweep_grace_s: float = 120.0
    #: how long a round waits for every partition's manifest to move after the fault
    resume_timeout_s: float = 180.0
    segment_bytes: int = 64 << 10
    local_retention_bytes: int = 128 << 10


@dataclass(slots=True)
class StoreRound:
    index: int
    fault: str
    fault_s: float
    #: requests the proxy faulted in the round, by kind
    faulted: dict[str, int] = field(default_factory=dict)
    #: from the fault's end until every partition's manifest moved (uploads resumed)
    resumed_s: float | None = None
    #: refused-deletes rounds: what the sweep said while deletes were refused
    sweep: str = ""
    note: str = ""


class ObjectStoreCampaign(campaign.Campaign):
    def __init__(
        self,
        directory: Path,
        settings: campaign.Settings,
        faults: StoreFaults | None = None,
        progress: Any = print,
    ) -> None:
        super().__init__(directory, settings, progress)
        self.faults = faults or StoreFaults()
        self.cluster = LocalCluster(directory / "local", 3, object_store="minio")
        self.minio: MinioServer | None = None
        self.proxy: FaultProxy | None = None
        self.user: TierUser | None = None
        self.store_rounds: list[StoreRound] = []
        self.sweep_errors: list[str] = []
        #: refused-deletes rounds: objects planted as a deleted incarnation's remains, how
        #: many of them the sweep left while deletes were refused, and deleted after the lift
        self.remains_planted = 0
        self.remains_kept_while_refused = 0
        self.remains_deleted_after_lift = 0

    async def run(self) -> dict[str, Any]:
        try:
            return await super().run()
        finally:
            if self.proxy is not None:
                self.proxy.stop()
            if self.minio is not None:
                self.minio.stop()

    # ------------------------------------------------------------------ set-up

    async def _prepare(self) -> None:
        await asyncio.to_thread(self._interpose)

    def _interpose(self) -> None:
        c = self.cluster
        record = c.record
        m = record["minio"]
        os.kill(m["pid"], signal.SIGKILL)
        port = free_port()
        while port == m["port"]:
            port = free_port()
        self.minio = MinioServer(
            procs.minio_binary(),
            Path(m["data_dir"]),
            port=port,
            access_key=m["access_key"],
            secret_key=m["secret_key"],
            log_path=self.dir / "minio.log",
        )
        self.minio.start()
        self.proxy = FaultProxy(self.minio.endpoint, port=m["port"], seed=self.settings.seed)
        waiting.until(self._proxy_started, 30.0, "the proxy on MinIO's old port", poll_s=0.1)
        self.user = TierUser(self.minio.endpoint, m["access_key"], m["secret_key"], m["bucket"])
        self.user.create()
        m.update(pid=self.minio.pid, access_key=self.user.access_key)
        m["secret_key"] = self.user.secret_key
        (c.dir / "local.json").write_text(json.dumps(record))
        for b in record["brokers"]:
            c.kill_broker(b["id"])
            c.restart_broker(b["id"])
            c.wait(lambda b=b: campaign.broker_ready(c, b["id"]), 60.0, "broker ready")

    def _proxy_started(self) -> bool:
        assert self.proxy is not None
        try:
            self.proxy.start()
        except OSError:  # the killed MinIO still holds the port
            self.proxy = FaultProxy(self.proxy.upstream, self.proxy.port, self.settings.seed)
            return False
        return True

    def _topic_manifest(self) -> str:
        f = self.faults
        return topic_manifest(
            campaign.TOPIC_NAME,
            self.settings.partitions,
            replicas=3,
            min_in_sync=2,
            upload_interval_s=1,
            local_retention_bytes=f.local_retention_bytes,
            segment_bytes=f.segment_bytes,
        )

    def direct_store(self) -> MinioStore:
        """The bucket, straight from MinIO with the root credentials (no proxy, no fault)."""
        assert self.minio is not None
        return MinioStore(
            MinioSettings(
                endpoint=self.minio.endpoint,
                bucket=self.cluster.record["minio"]["bucket"],
                access_key=self.minio.access_key,
                secret_key=self.minio.secret_key,
            )
        )

    def topic_ref(self) -> TopicRef:
        return TopicRef(CLUSTER_ID, campaign.TOPIC, self.cluster.creation_id(campaign.TOPIC))

    # ------------------------------------------------------------------ rounds

    async def _round(self, index: int) -> campaign.Round:
        f = self.faults
        fault = self.rng.choice(f.kinds)
        seconds = self.rng.uniform(*(f.dead_s if fault == "kill-minio" else f.fault_s))
        r = StoreRound(index, fault, seconds)
        before = await asyncio.to_thread(self._checkpoints)
        assert self.proxy is not None
        assert self.minio is not None
        assert self.user is not None
        counted = dict(self.proxy.counts)
        if fault == "kill-minio":
            self.minio.kill()
            await asyncio.sleep(seconds)
            await asyncio.to_thread(self.minio.start)
        elif fault == "refuse-deletes":
            remains = TopicRef(CLUSTER_ID, campaign.TOPIC, f"chaos-remains-{index}")
            planted = await asyncio.to_thread(self._plant_remains, remains)
            await asyncio.to_thread(self.user.refuse_deletes, True)
            refused = await asyncio.to_thread(self._sweep, remains, 0.0)
            live = await asyncio.to_thread(self._sweep, self.topic_ref(), f.sweep_grace_s)
            kept = await asyncio.to_thread(self._present, planted)
            await asyncio.sleep(seconds)
            await asyncio.to_thread(self.user.refuse_deletes, False)
            lifted = await asyncio.to_thread(self._sweep, remains, 0.0)
            gone = not await asyncio.to_thread(self._present, planted)
            self.remains_planted += len(planted)
            self.remains_kept_while_refused += len(kept)
            self.remains_deleted_after_lift += len(planted) if gone else 0
            r.sweep = (
                f"remains while refused: {refused}, {len(kept)}/{len(planted)} kept;"
                f" live topic: {live}; after the lift: {lifted}"
            )
        else:
            self.proxy.faults = {
                "throttle": Faults(slowdown=f.slowdown),
                "reset": Faults(reset=f.reset, lost_answer=f.lost_answer),
                "hang": Faults(delay=f.hang_share, delay_s=f.hang_s),
            }[fault]
            await asyncio.sleep(seconds)
            self.proxy.faults = Faults()
        r.faulted = {
            k: v - counted.get(k, 0)
            for k, v in self.proxy.counts.items()
            if k != "forwarded" and v != counted.get(k, 0)
        }
        ended = time.monotonic()
        deadline = ended + f.resume_timeout_s
        while time.monotonic() < deadline:
            now = await asyncio.to_thread(self._checkpoints)
            if all(now.get(p, -1) > before.get(p, -1) for p in range(self.partitions)):
                r.resumed_s = time.monotonic() - ended
                break
            await asyncio.sleep(0.2)
        else:
            r.note = f"a manifest did not move within {f.resume_timeout_s:.0f}s"
        self.store_rounds.append(r)
        # the campaign's line for the round: its "full LRS" time is the time uploads took
        # to resume
        note = f"{fault} {r.faulted}{'  sweep: ' + r.sweep if r.sweep else ''}"
        return campaign.Round(
            index,
            "objectstore",
            0,
            "minio" if fault == "kill-minio" else "the proxy",
            seconds,
            recovery_s=r.resumed_s,
            note=f"{note}  {r.note}".strip(),
        )

    def _checkpoints(self) -> dict[int, int]:
        """Each partition's stored checkpoint, read straight from MinIO (-1: none yet)."""
        store = self.direct_store()
        try:
            ref = self.topic_ref()
            out = {}
            for p in range(self.partitions):
                found = check_partition(store, ref.partition_prefix(p))
                out[p] = -1 if found.manifest is None else found.manifest.checkpoint
            return out
        except (ObjectStoreError, OSError):
            return {}
        finally:
            store.close()

    def _plant_remains(self, remains: TopicRef) -> list[str]:
        """A deleted incarnation's remains (no broker writes under its prefix): a segment
        object and its index, unlisted, for the sweep to find."""
        store = self.direct_store()
        try:
            key = layout.segment_key(remains.partition_prefix(0), 0, 99)
            planted = [key, layout.index_key_for(key)]
            for k in planted:
                store.put(k, b"remains")
            return planted
        finally:
            store.close()

    def _present(self, object_keys: list[str]) -> list[str]:
        store = self.direct_store()
        try:
            return [k for k in object_keys if store.exists(k)]
        finally:
            store.close()

    def _sweep(self, ref: TopicRef, grace_s: float) -> str:
        """The orphan sweep (``headrace tier sweep --apply``) as the brokers' user: while
        deletes are refused it deletes nothing and fails with ``ObjectStoreAccessDenied``."""
        from headrace.objectstore.urls import open_store  # as the CLI opens it

        m = self.cluster.record["minio"]
        url = f"s3://{m['host']}:{m['port']}/{m['bucket']}"
        env = {
            "HEADRACE_OBJECT_STORE_ACCESS_KEY": m["access_key"],
            "HEADRACE_OBJECT_STORE_SECRET_KEY": m["secret_key"],
        }
        store = open_store(url, env)
        try:
            report = sweep_topic(
                store, ref, now_ms=int(time.time() * 1000), grace_ms=int(grace_s * 1000), apply=True
            )
        except ObjectStoreAccessDenied as exc:
            self.sweep_errors.append(exc.message)
            return f"refused ({exc.message[:80]})"
        except ObjectStoreError as exc:
            return f"failed ({type(exc).__name__})"
        finally:
            store.close()
        return f"{len(report.orphans)} orphans, {len(report.deleted)} deleted"

    # ------------------------------------------------------------------ report

    def _report(self, verdict: dict[str, Any], elapsed_s: float) -> dict[str, Any]:
        report = super()._report(verdict, elapsed_s)
        checks = []
        store = self.direct_store()
        try:
            ref = self.topic_ref()
            for p in range(self.partitions_ever):
                checks.append(check_partition(store, ref.partition_prefix(p)))
            listed = {s.key for c in checks if c.manifest for s in c.manifest.segments}
            stored = {
                info.key
                for info in store.list(ref.prefix)
                if info.key.endswith(layout.SEGMENT_SUFFIX)
            }
        finally:
            store.close()
        resumed = [r.resumed_s for r in self.store_rounds if r.resumed_s is not None]
        summary = {
            "rounds_by_fault": {
                f: sum(1 for r in self.store_rounds if r.fault == f) for f in FAULTS
            },
            "requests_faulted": dict(self.proxy.counts) if self.proxy is not None else {},
            "corrupt_manifests": sum(1 for c in checks if c.corrupt is not None),
            "manifest_gaps": sum(len(c.gaps) for c in checks),
            "listed_objects": len(listed),
            "listed_objects_missing": sum(len(c.missing) for c in checks),
            "listed_indexes_missing": sum(len(c.missing_indexes) for c in checks),
            "unlisted_segment_objects": len(stored - listed),
            "rounds_not_resumed": sum(1 for r in self.store_rounds if r.resumed_s is None),
            "uploads_resumed_s": campaign.distribution(resumed),
            "sweeps_refused": len(self.sweep_errors),
            "remains_planted": self.remains_planted,
            "remains_kept_while_refused": self.remains_kept_while_refused,
            "remains_deleted_after_lift": self.remains_deleted_after_lift,
            "partitions": [c.to_doc() for c in checks],
            "round_log": [asdict(r) for r in self.store_rounds],
        }
        report["objectstore"] = summary
        report["ok"] = bool(
            report["ok"]
            and summary["corrupt_manifests"] == 0
            and summary["manifest_gaps"] == 0
            and summary["listed_objects_missing"] == 0
            and summary["rounds_not_resumed"] == 0
            and self.remains_kept_while_refused == self.remains_planted
            and self.remains_deleted_after_lift == self.remains_planted
        )
        return report


def table(report: dict[str, Any]) -> str:
    """The object store's rows, printed after the campaign's table."""
    s = report["objectstore"]
    r = s["uploads_resumed_s"]
    rows = [
        ("object-store rounds", str(s["rounds_by_fault"])),
        ("requests faulted by the proxy", str(s["requests_faulted"])),
        ("corrupt manifests", s["corrupt_manifests"]),
        ("manifest gaps", s["manifest_gaps"]),
        (
            "listed objects missing / listed",
            f"{s['listed_objects_missing']} / {s['listed_objects']}",
        ),
        ("unlisted segment objects (orphans for the sweep)", s["unlisted_segment_objects"]),
        (
            "uploads resumed after the fault (s)",
            f"median {r['median']}, p90 {r['p90']}, max {r['max']} over {r['count']}",
        ),
        ("rounds whose uploads did not resume", s["rounds_not_resumed"]),
        ("sweeps refused by the delete policy", s["sweeps_refused"]),
        (
            "planted orphans: kept while refused / deleted after the lift / planted",
            f"{s['remains_kept_while_refused']} / {s['remains_deleted_after_lift']}"
            f" / {s['remains_planted']}",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
