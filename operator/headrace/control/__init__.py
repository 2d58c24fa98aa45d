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
``looping.ControlLoop`` runs it (persisting as ``documents`` describes)::

    state = ClusterState.from_json(stored) if stored else ClusterState()
    since = now_ms()                                  # when this process started polling
    latest: dict[int, Heartbeat] = {}
    every poll interval (1 s):
        for each broker endpoint that answered:
            latest[hb.broker_id] = Heartbeat.from_json(doc, received_ms=now_ms())
        decision = reconcile(state, specs, latest, now_ms(), settings,
                             observing_since_ms=since,
                             unload_requests=unloads, unload_progress=progress)
        if decision.changed:                          # generation is one higher
            persist(decision.state.to_json())
        if decision.unloads_changed:                  # after the state: see unloads
            persist each decision.unloads[name].to_json()
        if decision.changed: push it to every broker
        state, progress = decision.state, decision.unloads
        publish decision.problems as Ready conditions, decision.events as Events,
        decision.liveness / decision.adoption_floor as observed (non-durable) status

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
version (per topic, bumped only by ``grow_topic``); a cohort plan's
generation bumps only when its assignment changes; and a restarted
controller (persisted state, fresh heartbeats, a new ``observing_since_ms``)
changes nothing when nothing changed.
"""
