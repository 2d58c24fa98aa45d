"""Live fuzzing of a running broker: ``python -m bench.fuzz`` / ``make fuzz``.

``inputs`` builds the seed frames, the fallback mutator and the shadow decode;
``sender`` is the fuzzer process (atheris when it is installed, else a seeded
random mutator) that sends each input to the broker over a real socket;
``__main__`` runs a broker process, a producer alongside and the sender, watches
the broker for crashes and hangs, and checks the producer's acknowledged records.
"""
