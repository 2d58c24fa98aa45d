"""The local controller's membership (``set_members``): persisted, reloaded, validated."""

from __future__ import annotations

from pathlib import Path

import pytest
from controller_fakes import make, settle

from headrace.errors import InvalidRequest
from headrace.protocol.endpoints import BrokerEndpoint


def endpoints(*ids: int) -> list[BrokerEndpoint]:
    return [BrokerEndpoint(b, f"127.0.0.{2 + b}", 9092, 9644) for b in ids]


async def test_no_membership_until_set_then_it_survives_a_restart(tmp_path: Path) -> None:
    c = make(tmp_path)
    await settle(c)
    assert c.loop.members is None
    assert c.members_document()["members"] is None
    c.set_members(endpoints(0, 1))
    assert c.members == {0, 1}
    assert c.members_document()["members"] == [0, 1]
    await settle(c)
    assert c.loop.members == {0, 1}, "the loop takes it at its step"
    doc = c.members_document()
    assert doc["members"] == [0, 1]
    assert set(doc) >= {"moving", "waiting", "blocked", "released", "evacuating", "live"}
    assert make(tmp_path).members == {0, 1}, "a restarted controller keeps it"


def test_a_membership_without_brokers_or_with_a_duplicate_is_refused(tmp_path: Path) -> None:
    c = make(tmp_path)
    with pytest.raises(InvalidRequest):
        c.set_members([])
    with pytest.raises(InvalidRequest):
        c.set_members([*endpoints(0, 1), *endpoints(1)])
    assert c.members is None
    assert not (tmp_path / "state" / "members.json").exists()


async def test_the_moves_it_reports_are_the_new_memberships_only_once_a_step_decided_on_it(
    tmp_path: Path,
) -> None:
    # ``local add-broker`` waits until nothing moves: an answer given before the loop has
    # decided on the new membership (a step already under way took the old one) says
    # nothing moves, and the command returned before any replica had moved
    c = make(tmp_path)
    c.set_members(endpoints(0, 1, 2))
    await settle(c)
    assert c.members_document()["decided"] is True
    c.set_members(endpoints(0, 1, 2, 3))
    assert c.members_document()["decided"] is False
    await c.step()
    assert c.members_document()["decided"] is True
