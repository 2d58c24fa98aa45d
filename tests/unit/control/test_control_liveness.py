"""Liveness from heartbeats with a TTL, on a fake clock, and the adoption floor."""

from __future__ import annotations

import pytest
from control_fakes import FakeClock, beat

from headrace.control.liveness import adoption_floor, assess, is_live

TTL = 3_000
START = 1_000_000


@pytest.mark.parametrize(
    ("heard_at", "now", "verdict"),
    [
        # the table in the module docstring, row by row, at its edges
        (START, START, "live"),
        (START, START + TTL, "live"),
        (START, START + TTL + 1, "dead"),
        (None, START, "unheard"),
        (None, START + TTL, "unheard"),
        (None, START + TTL + 1, "dead"),
    ],
)
def test_verdicts(heard_at: int | None, now: int, verdict: str) -> None:
    heartbeats = {} if heard_at is None else {1: beat(1, heard_at)}
    seen = assess([1], heartbeats, now, TTL, observing_since_ms=START)
    got = {"live": seen.live, "dead": seen.dead, "unheard": seen.unheard}
    assert {k for k, v in got.items() if 1 in v} == {verdict}


def test_a_broker_is_live_while_it_keeps_beating_on_a_fake_clock() -> None:
    clock = FakeClock(START)
    last = beat(0, clock.now_ms)
    for _ in range(10):  # a beat every second keeps it live
        clock.advance(1_000)
        assert is_live(last, clock.now_ms, TTL)
        last = beat(0, clock.now_ms)
    clock.advance(TTL)
    assert is_live(last, clock.now_ms, TTL), "exactly one TTL old is still live"
    clock.advance(1)
    assert not is_live(last, clock.now_ms, TTL)
    assert not is_live(None, clock.now_ms, TTL)


def test_unknown_brokers_with_heartbeats_are_classified_too() -> None:
    seen = assess([], {5: beat(5, START)}, START, TTL, observing_since_ms=START)
    assert seen.live == {5}


def test_warming_up_lasts_until_every_known_broker_is_heard_or_dead() -> None:
    hbs = {0: beat(0, START)}
    assert assess([0, 1], hbs, START, TTL, START).warming_up
    assert not assess([0, 1], hbs | {1: beat(1, START)}, START, TTL, START).warming_up
    later = START + TTL + 1
    assert not assess([0, 1], {0: beat(0, later)}, later, TTL, START).warming_up


def test_draining_is_reported_only_for_live_brokers() -> None:
    hbs = {0: beat(0, START, draining=True), 1: beat(1, START - TTL - 1, draining=True)}
    seen = assess([0, 1], hbs, START, TTL, START)
    assert seen.draining == {0}
    assert seen.dead == {1}


def test_adoption_floor_is_the_minimum_over_live_brokers() -> None:
    hbs = {0: beat(0, START, adoption=9), 1: beat(1, START, adoption=7), 2: beat(2, START)}
    assert adoption_floor(hbs, {0, 1, 2}) == 7


def test_adoption_floor_ignores_dead_brokers() -> None:
    clock = FakeClock(START)
    hbs = {0: beat(0, clock.now_ms, adoption=9), 1: beat(1, clock.now_ms, adoption=2)}
    clock.advance(TTL + 1)
    hbs[0] = beat(0, clock.now_ms, adoption=9)  # broker 1 fell silent: its label is frozen
    seen = assess([0, 1], hbs, clock.now_ms, TTL, START)
    assert seen.live == {0}
    assert adoption_floor(hbs, seen.live) == 9


def test_no_adoption_label_anywhere_means_none() -> None:
    assert adoption_floor({0: beat(0, START)}, {0}) is None
    assert adoption_floor({}, set()) is None
    assert adoption_floor({0: beat(0, START, adoption=3)}, set()) is None
