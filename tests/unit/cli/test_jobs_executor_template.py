"""``headrace compact``/``verify --executor-pod-template``: a JSON object or a usage error
before Spark starts (the file it becomes is checked by ``tests/integration/jobs``)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from headrace.cli import jobs


@pytest.mark.parametrize(("text", "why"), [("{nope", "not JSON"), ("[1]", "a JSON object")])
def test_a_template_that_is_not_a_json_object_is_a_usage_error(text: str, why: str) -> None:
    done = CliRunner().invoke(jobs.compact, ["ns/orders", "--executor-pod-template", text])
    assert done.exit_code == 2
    assert "--executor-pod-template" in done.output and why in done.output
