"""``python -m headrace.broker``: run one broker (see :mod:`headrace.broker.main`)."""

from headrace.broker.main import broker

broker(prog_name="python -m headrace.broker")
