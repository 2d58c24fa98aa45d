"""``python -m headrace.operator``: run the operator (see :mod:`headrace.operator.main`)."""

from headrace.operator.main import operator

operator(prog_name="python -m headrace.operator")
