"""The integration harness the tests, the e2e suite and the benchmarks share.

It lives outside the product wheel (its own code root, ``testing/``, which the
editable install and pytest put on the path), so nothing here ships, and no
product package may import it (an import-linter contract says so).

``procs`` starts and reaps processes (brokers, redis-servers, client workers) and
measures their CPU; ``minio`` runs a real MinIO server; ``waiting`` polls a
condition until it holds or a deadline passes; ``reading`` reads a partition back
with plain FETCH requests, for verification; ``recording`` is a transport that
keeps what a connection writes, for the unit tests that drive one without a socket.
"""
