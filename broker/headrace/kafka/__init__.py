"""The Kafka protocol: a sans-I/O codec (``wire``, ``schema``, ``messages``, ``batches``)."""
