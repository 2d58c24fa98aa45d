"""The Kafka API's handlers (``kafka_listener.KafkaConnection``), one module per concern.

``kafka_listener.KafkaConnection`` is the protocol adapter: it cuts frames, decodes
each request (``kafka.messages``), checks the authentication gate, dispatches by API
key through one table, and writes the answers in request order. The handlers here
decide what a request means: each takes the request's header and decoded body and
returns the response body (or a future or coroutine of it, when the answer waits).
They see the connection as a ``context.KafkaRequestContext`` (the broker, the
connection's access, its peer, the advertised address), never its socket, and each
class names its APIs in ``routes()``:

- ``session``: ApiVersions and SASL: PLAIN, SCRAM-SHA-256/512 (one ``SaslSession`` per connection)
- ``metadata``: Metadata and DescribeCluster, and how topics are named to Kafka clients
- ``producing``: Produce (the hot write path) and InitProducerId
- ``fetching``: Fetch, from the local log, a long poll or the object store (the hot read path)
- ``log_offsets``: ListOffsets and OffsetForLeaderEpoch
- ``group_coordination``: FindCoordinator and the consumer-group membership APIs
- ``committed_offsets``: OffsetCommit, OffsetFetch and OffsetDelete
- ``topic_admin``: CreateTopics, DeleteTopics and CreatePartitions
- ``topic_configs``: DescribeConfigs, AlterConfigs and IncrementalAlterConfigs
"""
