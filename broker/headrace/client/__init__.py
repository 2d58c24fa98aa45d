"""The headrace Python client: async Producer and Consumer, plus a blocking facade."""

from headrace.client.consumer import ConsumedBatch, Consumer
from headrace.client.producer import Producer, RecordMetadata

__all__ = ["ConsumedBatch", "Consumer", "Producer", "RecordMetadata"]
