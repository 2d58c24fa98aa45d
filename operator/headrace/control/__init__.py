"""The control core: placement, elections, LRS membership, cohort plans, unloads (pure).

No asyncio, sockets, files, clocks or Kubernetes client in here: every
function takes the persisted status, the desired specs, the latest broker
heartbeats and the time (``now_ms``, from the controller's clock) and returns
the next status. The controller process (local mode) and the kopf operator
(Kubernetes) do the I/O around it, in the style of h11.

Modules
-------
``model``         the persisted documents: ``ClusterState``/``TopicStatus``/
                  ``PartitionStatus``/``CohortPlan`` (and ``BrokerEndpoint``),
                  with camelCase ``to_json``/``from_json``. What a broker
                  reports (``Heartbeat``) and the topology pushed to it
                  (``ClusterTopology``) are wire documents in
                  ``headrace.protocol.coordination``
``settings``      ``ControlSettings``: liveness TTL, candidate wait, offline retry
``liveness``      live / dead / unheard brokers, and the adoption floor
``placement``     ``place``: replica lists spread over distinct brokers
``election``      the per-partition election and LRS table (``step``)
``cohort_plans``  sticky, coverage-first, balanced cross-broker cohort plans
``unloads``       the Unload state machine: seal, reassign, complete (``step``)
``repartitions``  the live repartition state machine: cutover, stamp, per-cohort
                  drain, finalize gate (``step``; docs/repartition.md)
``admission``     what ``apply`` refuses: Topic and Repartition problems
``reconcile``     ``reconcile``: one whole step, and ``grow_topic``
``topology``      ``cluster_topology``: the ``ClusterTopology`` pushed to brokers;
                  ``snapshot``: its client-facing ``TopologySnapshot``
``documents``     resources to and from the core's types: ``spec_of``,
                  ``topic_config``, ``unload_request``, status and condition
                  builders, and ``restore`` (crash-safe persistence)
``looping``       ``ControlLoop``, the loop both controllers run, and its
                  ports: ``StatusStore``, ``BrokerFleet``, ``Clock``

The controller loop
-------------------
``looping.ControlLoop`` runs it (the ports are ``store``, ``fleet`` and
``clock``; persistence as ``documents`` describes)::

    stored = store.load()                             # Topic, Unload, Repartition docs, cluster doc
    restored = documents.restore(stored.cluster, {name: topic's status})
    state = restored.state
    floor = restored.highest + 1 if restored.torn else None   # commit above it before a push
    since = clock.now_ms()                            # when this process started polling
    latest: dict[int, Heartbeat] = {}
    every poll interval (1 s; 100 ms while an unload or a seal is in flight):
        for broker_id, report in fleet.poll():        # None: gone (drop its heartbeat)
            latest[broker_id] = report.heartbeat      # received_ms from the clock
        specs = [spec_of(topic) for each Topic]       # one that fails: that Topic's InvalidSpec
        decision = reconcile(StepInputs(state, specs, latest, clock.now_ms(), settings,
                                        observing_since_ms=since,
                                        unload_requests=unloads, unload_progress=progress,
                                        deletions=requested))  # a topic leaves only when asked
        if floor and decision.state.generation < floor:
            raise decision.state.generation to floor  # never reuse a stamped generation
        if decision.changed or the problems changed or a Topic's generation is unobserved:
            for each Topic whose status changed:      # stamped topologyGeneration
                store.write_topic_status(name, documents.topic_status(...))
            store.write_cluster_status(documents.cluster_status(decision.state,
                                                                decision.liveness))  # last
            floor = None                              # a failed write sets it to generation + 1
            state = decision.state
        else if liveness changed:
            store.write_cluster_status(documents.with_liveness(record, decision.liveness))
        if decision.unloads_changed:                  # after the state: see unloads
            progress = decision.unloads
            store.write_unload_status(name, documents.unload_status(...)) for each changed
        release deleted Unloads whose moves have finished
        for each live broker whose heartbeat shows a generation below state.generation:
            fleet.push(broker_id, topology.cluster_topology(state, ...).to_json())
        log decision.events; decision.problems become the Topics' Ready conditions

What brokers must do with the pushed state
------------------------------------------
* A partition whose ``candidate`` is this broker (state ``Electing``)
  promotes itself to leader at ``leaderEpoch`` and reports role ``leader`` at
  that epoch in its next heartbeat; the controller then makes it ``Online``.
* A leader reports its live replica set at its epoch (``liveReplicas``); the
  controller persists it, always with the leader, never with a non-replica.
  A new leader should start its LRS from the pushed ``liveReplicas``.
* A broker that is neither ``leader`` nor ``candidate`` of a partition does
  not accept produce for it; epochs fence the rest.
* A leader of a partition with ``seal`` set seals it (stops appends, uploads
  everything, writes the sealed state to the object store) and reports
  ``sealed`` at its epoch and incarnation (``moves``). Every replica of a
  partition whose ``moves`` grew drops its local copy and opens it empty at
  ``startOffset`` (null: after the last offset in the object store); its
  leader reports ``moves`` and ``startOffset`` (see ``unloads``).
* Cohort plans are advisory: a broker ignores a plan with a lower
  ``generation`` than the one it holds and falls back to local assignment
  when a planned member is not connected to it.

Invariants
----------
Epochs strictly increase per partition on every nomination; only live LRS
members are nominated and only a live candidate that reports its promotion
becomes leader (no unclean election); the topology generation (``generation``)
bumps exactly when persisted content changes and is never the partitioning
version (per topic, bumped only by a repartition's cutover, once per
transition: only when the topic has no marker); a cohort plan's
generation bumps only when its assignment changes; and a restarted
controller (persisted state, fresh heartbeats, a new ``observing_since_ms``)
changes nothing when nothing changed.
"""
