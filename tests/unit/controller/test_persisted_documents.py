"""Every document the controller persists is one the API server would accept and keep whole.

The real controller (``Controller.step``: the control loop, the control core
and the file store; its brokers the scripted fleet of ``controller_fakes``, on
a manual clock) is driven through scenarios that leave elections in flight, seal markers, moves,
recoveries from the object store, cohort plans, problems and deleted Unloads
in its state directory. After every call the directory is read back, and
each Topic and Unload document, and the cluster document (``cluster.json``,
against the BrokerCluster CRD's status schema), is checked against the
OpenAPI v3 schema of the committed CRD (``crds/``), twice:

* validation (``jsonschema``, Draft 4: the dialect OpenAPI v3.0 schemas use,
  with the ``date-time``/``int32``/``int64`` formats the API server checks);
* structural pruning: a field the schema does not declare (outside
  ``x-kubernetes-preserve-unknown-fields``), or a null where the schema is not
  ``nullable``, is dropped by the API server before the object is stored.
  Validation alone would not notice, since the dropped field is simply gone.

CEL rules (``x-kubernetes-validations``) are not evaluated here; the specs
were validated by the models when applied.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from controller_fakes import TOPIC, ManualClock, ScriptedController, ScriptedFleet, unload

from headrace.control.documents import spec_of
from headrace.control.settings import ControlSettings
from headrace.controller.controlling import ControllerSettings
from headrace.errors import InvalidTopicSpec
from headrace.protocol.endpoints import BrokerEndpoint
from headrace.resources import topics as topic_models

CRDS = Path(__file__).resolve().parents[3] / "crds"
SETTINGS = ControlSettings(
    liveness_ttl_ms=3_000,
    candidate_wait_ms=5_000,
    offline_retry_ms=30_000,
    unload_recovery_timeout_ms=5_000,
)
ORDERS = "default/orders"
#: ObjectMeta fields the local store may write (the API server owns metadata's schema)
OBJECT_META = frozenset(
    {
        "name",
        "namespace",
        "labels",
        "annotations",
        "generation",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "deletionTimestamp",
        "finalizers",
    }
)


# --------------------------------------------------------------------------- the checks


def crd_schema(plural: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / f"{plural}.headrace.dev.yaml").read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def status_schema(plural: str) -> dict[str, Any]:
    """The CRD's schema of ``.status``: what a status document (the subresource) must be."""
    schema: dict[str, Any] = crd_schema(plural)["properties"]["status"]
    return schema


FORMATS = jsonschema.FormatChecker(formats=())


@FORMATS.checks("date-time", raises=ValueError)
def _date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    when = dt.datetime.fromisoformat(value)
    return "T" in value and when.tzinfo is not None


@FORMATS.checks("int64")
def _int64(value: object) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


@FORMATS.checks("int32")
def _int32(value: object) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


def pruned(value: Any, schema: Mapping[str, Any], path: str) -> Iterator[str]:
    """Where the API server's structural pruning would drop something from ``value``."""
    if value is None:
        if not schema.get("nullable"):
            yield f"{path}: null"
        return
    if isinstance(value, Mapping):
        declared = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        keep = schema.get("x-kubernetes-preserve-unknown-fields") is True
        for key, child in value.items():
            where = f"{path}.{key}" if path else key
            if key in declared:
                yield from pruned(child, declared[key], where)
            elif isinstance(extra, Mapping):
                yield from pruned(child, extra, where)
            elif not keep:
                yield f"{where}: not in the schema"
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from pruned(child, schema.get("items", {}), f"{path}[{i}]")


def _where(path: Iterable[str | int]) -> str:
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    return text.lstrip(".") or "<root>"


def problems(doc: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Why the API server would reject ``doc`` or store less than it."""
    validator = jsonschema.Draft4Validator(schema, format_checker=FORMATS)
    found = [f"{_where(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
    body = {k: v for k, v in doc.items() if k != "metadata"}
    found += pruned(body, schema, "")
    found += [f"metadata.{k}: not ObjectMeta" for k in set(doc.get("metadata", {})) - OBJECT_META]
    return found


def test_the_checks_catch_what_the_api_server_would_drop_or_refuse() -> None:
    schema = crd_schema("topics")
    doc = json.loads(json.dumps(TOPIC))
    assert problems(doc, schema) == []
    doc["status"] = {"partitioningVersion": 1, "bogus": 1, "partitions": [{"partition": 0}]}
    doc["status"]["partitions"][0]["leader"] = None
    doc["metadata"]["bogus"] = 1
    doc["spec"]["partitions"] = "2"
    assert sorted(problems(doc, schema)) == [
        "metadata.bogus: not ObjectMeta",
        "spec.partitions: '2' is not of type 'integer'",
        "status.bogus: not in the schema",
        "status.partitions[0].leader: None is not of type 'integer'",
        "status.partitions[0].leader: null",
    ]
    doc = {"status": {"conditions": [{"lastTransitionTime": "yesterday"}]}}
    assert any("is not a 'date-time'" in p for p in problems(doc, schema))


# --------------------------------------------------------------------------- the controller


class Harness:
    """A controller with its fleet and clock, and every document version it wrote."""

    def __init__(self, root: Path, brokers: int = 3) -> None:
        self.clock = ManualClock()
        self.root = root / "state"
        endpoints = tuple(BrokerEndpoint(b, f"10.0.0.{b}", admin_port=9644) for b in range(brokers))
        self.fleet = ScriptedFleet(endpoints, self.clock)
        self.controller = ScriptedController(
            ControllerSettings(self.root, endpoints, control=SETTINGS), self.fleet
        )
        #: (file name, document) of every version written, in order, without repeats
        self.written: list[tuple[str, dict[str, Any]]] = []
        self.snapshot()

    def snapshot(self) -> None:
        for path in sorted(self.root.rglob("*.json")):
            doc = json.loads(path.read_text())
            name = str(path.relative_to(self.root))
            if (name, doc) not in self.written:
                self.written.append((name, doc))

    async def step(self, n: int = 1, advance_ms: int = 1_000) -> None:
        for _ in range(n):
            self.clock.advance(advance_ms)
            await self.controller.step()
            self.snapshot()

    def apply(self, *resources: dict[str, Any]) -> None:
        self.controller.apply([json.loads(json.dumps(r)) for r in resources])
        self.snapshot()

    def apply_unloads(self, *resources: dict[str, Any]) -> None:
        self.controller.apply_unloads([json.loads(json.dumps(r)) for r in resources])
        self.snapshot()

    def statuses(self, folder: str) -> list[dict[str, Any]]:
        return [d.get("status", {}) for n, d in self.written if n.startswith(folder + "/")]

    def partitions(self) -> list[dict[str, Any]]:
        return [p for s in self.statuses("topics") for p in s.get("partitions", [])]

    def check(self) -> None:
        """Every document written is one the API server would accept and keep whole."""
        schemas = {"topics": crd_schema("topics"), "unloads": crd_schema("unloads")}
        cluster = status_schema("brokerclusters")
        found = []
        for name, doc in self.written:
            folder = name.split("/")[0]
            if folder in schemas:
                found += [f"{name}: {p}" for p in problems(doc, schemas[folder])]
            else:
                # The commit record is the BrokerCluster's status, whole.
                assert name == "cluster.json", name
                found += [f"{name}: {p}" for p in problems(doc, cluster)]
        assert any(n == "cluster.json" for n, _ in self.written), "no commit record written"
        assert found == [], "\n".join(found)


def topic(replicas: int = 3, **spec: Any) -> dict[str, Any]:
    doc = json.loads(json.dumps(TOPIC))
    doc["spec"].update({"replicas": replicas, "minInSync": min(2, replicas), **spec})
    return dict(doc)


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


# --------------------------------------------------------------------------- scenarios


async def test_elections_in_flight_and_offline_partitions_persist_whole(
    harness: Harness,
) -> None:
    h = harness
    h.apply(topic(replicas=3, partitions=2))
    await h.step(3)
    leader = h.controller.state.topics[ORDERS].partitions[0].leader
    assert leader is not None
    h.fleet.refuses.update(h.fleet.endpoints)  # no nominee promotes: the election stays
    h.fleet.down.add(leader)
    await h.step(4)  # the TTL passes: a candidate is nominated
    await h.step(12)  # candidates time out one by one: Offline
    electing = [p for p in h.partitions() if p["state"] == "Electing"]
    assert electing and all("candidate" in p and "deadlineMs" in p for p in electing)
    assert any(p["tried"] for p in electing)
    offline = [p for p in h.partitions() if p["state"] == "Offline"]
    assert offline and any("deadlineMs" in p for p in offline)
    h.check()


async def test_seals_moves_and_recoveries_persist_whole(harness: Harness) -> None:
    h = harness
    h.apply(topic(replicas=1, partitions=2))
    await h.step(3)
    owner = h.controller.state.topics[ORDERS].partitions[0].leader
    assert owner is not None
    h.fleet.stuck.add(owner)  # the seal marker stays set for a while
    h.apply_unloads(unload("move", [0], target=(owner + 1) % 3))
    await h.step(2)
    assert any(p.get("seal") for p in h.partitions())
    h.fleet.stuck.discard(owner)
    await h.step(4)
    moved = [p for p in h.partitions() if p.get("moves") == 1 and p["partition"] == 0]
    assert moved and "startOffset" in moved[-1]
    # partition 1's owner dies mid-seal (RF=1): reopened from the object store
    owner1 = h.controller.state.topics[ORDERS].partitions[1].leader
    assert owner1 is not None
    h.fleet.stuck.add(owner1)
    h.apply_unloads(unload("rescue", [1], target=None))
    await h.step(1)
    h.fleet.down.add(owner1)
    await h.step(12)
    (rescue,) = [d for n, d in h.written if n.endswith("default.rescue.json")][-1:]
    assert rescue["status"]["moves"][0]["recovery"]["source"] == "ObjectStore"
    assert any(
        p["partition"] == 1 and p.get("moves") == 1 and "startOffset" not in p
        for p in h.partitions()
    )
    h.check()


async def test_deleted_unloads_and_problems_persist_whole(harness: Harness) -> None:
    h = harness
    h.apply(topic(replicas=1, partitions=2, tieredStorage={"enabled": False}))
    await h.step(3)
    h.apply_unloads(unload("untiered", [0]))
    await h.step(2)
    assert any(s.get("phase") == "Failed" for s in h.statuses("unloads"))
    h.apply(topic(replicas=1, partitions=2))
    await h.step(1)
    owner = h.controller.state.topics[ORDERS].partitions[0].leader
    assert owner is not None
    h.fleet.stuck.add(owner)
    h.apply_unloads(unload("cancelled", [0, 1], target=(owner + 1) % 3))
    await h.step(2)
    h.controller.delete_unloads(["default/cancelled"])
    h.snapshot()
    await h.step(2)
    assert any(
        "deletionTimestamp" in d["metadata"] for n, d in h.written if n.startswith("unloads/")
    )
    not_ready = [
        c for s in h.statuses("topics") for c in s.get("conditions", []) if c["status"] == "False"
    ]
    assert not_ready
    h.fleet.stuck.discard(owner)
    await h.step(4)
    h.check()


async def test_cohort_plans_persist_whole(harness: Harness) -> None:
    h = harness
    h.apply(topic(replicas=2, partitions=4))
    await h.step(3)
    h.fleet.members[0] = {(ORDERS, "readers"): {"m-1", "m-2"}}
    h.fleet.members[1] = {(ORDERS, "readers"): {"m-3"}}
    h.fleet.members[2] = {(ORDERS, "audit"): {"a-1"}}
    await h.step(2)
    h.fleet.members[1].clear()
    await h.step(2)
    plans = [s["cohortPlans"] for s in h.statuses("topics") if s.get("cohortPlans")]
    assert plans and {p["cohort"] for p in plans[-1]} == {"readers", "audit"}
    assert any(p["generation"] > 1 for p in plans[-1])
    h.check()


async def test_a_restarted_controller_reads_back_what_it_persisted(harness: Harness) -> None:
    h = harness
    h.apply(topic(replicas=3, partitions=2))
    await h.step(3)
    h.fleet.members[0] = {(ORDERS, "readers"): {"m-1"}}
    h.fleet.refuses.update(h.fleet.endpoints)
    leader = h.controller.state.topics[ORDERS].partitions[0].leader
    assert leader is not None
    h.fleet.down.add(leader)
    await h.step(5)
    assert h.controller.state.topics[ORDERS].partitions[0].candidate is not None
    h.check()
    again = ScriptedController(h.controller.settings, h.fleet)
    assert again.state.topics == h.controller.state.topics


async def test_the_cluster_document_says_which_brokers_are_live(harness: Harness) -> None:
    h = harness
    h.apply(topic(replicas=1, partitions=1))
    await h.step(3)
    (p,) = h.controller.state.topics[ORDERS].partitions
    idle = next(b for b in range(3) if b not in p.replicas)
    generation = h.controller.state.generation

    def cluster() -> dict[str, Any]:
        return dict(json.loads((h.root / "cluster.json").read_text()))

    assert [b["live"] for b in cluster()["brokers"]] == [True, True, True]
    topic_files = {f: f.stat().st_mtime_ns for f in (h.root / "topics").glob("*.json")}
    h.fleet.down.add(idle)  # it holds nothing: nothing else changes
    await h.step(5)
    assert h.controller.state.generation == generation
    assert [b["id"] for b in cluster()["brokers"] if not b["live"]] == [idle]
    assert cluster()["topologyGeneration"] == generation
    assert {f: f.stat().st_mtime_ns for f in topic_files} == topic_files
    h.fleet.down.discard(idle)
    await h.step()
    assert all(b["live"] for b in cluster()["brokers"])
    h.check()


# --------------------------------------------------------------------------- observedGeneration


def topic_doc(h: Harness) -> dict[str, Any]:
    return dict(json.loads((h.root / "topics" / "default.orders.json").read_text()))


async def test_observed_generation_is_the_objects_metadata_generation(harness: Harness) -> None:
    h = harness
    applied = topic(replicas=3, partitions=2)
    applied["metadata"]["generation"] = 7  # the API server ignores what a client says
    h.apply(applied)
    doc = topic_doc(h)
    assert doc["metadata"]["generation"] == 1 and "creationTimestamp" in doc["metadata"]
    # applied, not yet reconciled (a new object has no status until the controller writes one)
    assert "observedGeneration" not in doc.get("status", {})
    await h.step(3)
    h.fleet.members[0] = {(ORDERS, "readers"): {"m-1"}}  # a plan: one more bump
    await h.step(2)
    doc = topic_doc(h)
    assert h.controller.state.generation > 1  # the topology generation is another counter
    assert doc["status"]["observedGeneration"] == 1
    assert doc["status"]["conditions"][0]["observedGeneration"] == 1
    created = doc["metadata"]["creationTimestamp"]

    h.apply(topic(replicas=3, partitions=2))  # the same spec: no new generation
    assert topic_doc(h)["metadata"]["generation"] == 1

    h.apply(topic(replicas=3, partitions=2, retention={"ms": 60_000}))
    doc = topic_doc(h)
    assert doc["metadata"] == {**doc["metadata"], "generation": 2, "creationTimestamp": created}
    assert doc["status"]["observedGeneration"] == 1  # not reconciled yet
    ready = doc["status"]["conditions"][0]
    topology = h.controller.state.generation
    await h.step()  # nothing in the cluster state changes, but the new spec is observed
    assert h.controller.state.generation == topology
    doc = topic_doc(h)
    assert doc["status"]["observedGeneration"] == 2
    assert doc["status"]["conditions"][0] == {**ready, "observedGeneration": 2}

    again = ScriptedController(h.controller.settings, h.fleet)  # a restart keeps both
    assert again.resources[ORDERS]["metadata"]["generation"] == 2
    assert again.loop.unobserved() == []
    h.check()


# --------------------------------------------------------------------------- spec defaults


def test_spec_defaults_are_the_models() -> None:
    bare = {
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"clusterRef": {"name": "local"}, "partitions": 2},
    }
    model = topic_models.TopicSpec.model_validate(bare["spec"])
    spec = spec_of(bare)
    assert (spec.replicas, spec.min_in_sync, spec.tiered) == (
        model.replicas,
        model.min_in_sync,
        model.tiered_storage.enabled,
    )
    one = {**bare, "spec": {**bare["spec"], "replicas": 1}}
    assert (
        spec_of(one).min_in_sync == topic_models.TopicSpec.model_validate(one["spec"]).min_in_sync
    )
    with pytest.raises(InvalidTopicSpec, match="minInSync"):
        spec_of({**bare, "spec": {**bare["spec"], "replicas": 1, "minInSync": 2}})
