"""Live fuzzing of a running broker: ``python -m bench.fuzz`` / ``make fuzz``.

``inputs`` builds the seed frames, the fallback mutator and the shadow decode of
our protocol; ``kafka_inputs`` the same for the Kafka listener (seed requests from
our Kafka codec; header, framing and record-batch mutations; a shadow decode that
knows which Produce requests were well-formed). ``sender`` is the fuzzer process
(atheris when it is installed, else a seeded random mutator) that sends each input
to the broker over a real socket. ``running`` (run by ``__main__``, for either
protocol) runs a broker process, a producer alongside and the sender, watches the
broker for crashes and hangs, and checks the producer's acknowledged records (and,
for Kafka, that nothing malformed was stored).
"""
