"""``Access.reload``: a good file replaces the grants and open sessions catch up at their
next check; a bad one changes nothing and is counted (headrace.broker.access)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from headrace.broker.access import Access
from headrace.broker.config import BrokerSettings
from headrace.errors import AuthenticationFailed, ProduceDenied
from headrace.security.acl import Operation, hash_token


class Labels:
    """A ``prometheus_client.Counter`` stand-in: counts per last label value (the result,
    or the denied operation) and per full label tuple."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.by_labels: Counter[tuple[str, ...]] = Counter()

    def labels(self, *values: str) -> Any:
        counts, by_labels = self.counts, self.by_labels

        class _Child:
            def inc(self) -> None:
                counts[values[-1]] += 1
                by_labels[values] += 1

        return _Child()


def acl_doc(*principals: tuple[str, str, list[str]]) -> str:
    return json.dumps(
        {
            "version": 1,
            "principals": [
                {
                    "name": name,
                    "tokens": [hash_token(token)],
                    "grants": [{"operations": ops, "topics": ["*"]}] if ops else [],
                }
                for name, token, ops in principals
            ],
        }
    )


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Access, Path, Labels, Labels]:
    acl_file = tmp_path / "acl.yaml"
    acl_file.write_text(acl_doc(("writer", "w-token", ["produce"]), ("ops", "o-token", ["admin"])))
    denials, reloads = Labels(), Labels()
    settings = BrokerSettings(data_dir=tmp_path, acl_file=acl_file)
    access = Access(settings, denials, reloads=reloads, member_identities=False)
    return access, acl_file, denials, reloads


def test_a_reload_applies_to_an_open_session(setup: tuple[Access, Path, Labels, Labels]) -> None:
    access, acl_file, denials, reloads = setup
    writer = access.session()
    writer.authenticate("w-token", None)
    writer.require(Operation.PRODUCE, "orders")  # remembered

    assert not access.reload_if_changed()  # nothing changed: no reload
    acl_file.write_text(acl_doc(("writer", "w-token", []), ("ops", "o-token", ["admin"])))
    assert access.reload_if_changed()
    assert reloads.counts == {"ok": 1}
    with pytest.raises(ProduceDenied):
        writer.require(Operation.PRODUCE, "orders")  # the remembered answer is dropped

    acl_file.write_text(acl_doc(("ops", "o-token", ["admin"])))
    assert access.reload()
    with pytest.raises(AuthenticationFailed, match="no longer valid"):
        writer.require(Operation.PRODUCE, "orders")
    assert denials.counts["authenticate"] == 1


def test_a_bad_file_keeps_the_grants_in_force(setup: tuple[Access, Path, Labels, Labels]) -> None:
    access, acl_file, _, reloads = setup
    writer = access.session()
    writer.authenticate("w-token", None)
    for bad in ("principals: [\n", acl_doc(("writer", "w-token", ["produce"])) + "\n{", "{}"):
        acl_file.write_text(bad)
        assert not access.reload()
        assert access.reload_error is not None
        assert "w-token" not in access.reload_error
        writer.require(Operation.PRODUCE, "orders")
    acl_file.unlink()
    assert not access.reload()  # a missing file too
    assert reloads.counts == {"error": 4}
    assert access.generation == 0
    writer.require(Operation.PRODUCE, "orders")
