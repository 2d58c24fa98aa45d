"""The wire protocol (pure, no sockets): the data port's frames and message bodies
(``frames``, ``messages``, ``replication``), and the JSON documents a broker and
its controller exchange over admin HTTP (``coordination``)."""
