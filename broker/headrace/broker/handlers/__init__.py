"""The op handlers of a client connection (``server.Connection``), one module per concern.

``server.Connection`` is the protocol adapter: it reads frames, checks the handshake
gate, dispatches each frame by its op through one table, and turns a handler's
error into an error frame. The handlers here decide what a frame means and answer
it through the connection's ``ports.FrameLink``; each class owns the per-connection
state of its concern (the topology subscription, the cohort membership, the replica
fetch session, the tiered reads in progress) and names its ops in ``routes()``:

- ``session``: handshake, ping, topology subscription
- ``producing``: produce (the hot write path)
- ``fetching``: fetch, from the local log, a long poll or the object store (the hot read path)
- ``membership``: a cohort member's join, credit, acks, heartbeats, seeks and leave
- ``replica_serving``: a follower broker's replica fetches and epoch queries
- ``topic_admin``: topic and cohort administration
"""
