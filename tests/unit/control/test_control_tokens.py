"""The token planner (``control.tokens``): made once, rotated on a new ``rotateToken``
value, the previous token accepted for its grace and then dropped, never two rotations'
worth of old tokens."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.control.tokens import TokenEvent, TokenState, plan
from headrace.security.acl import hash_token

GRACE = 600_000
T0 = 1_795_000_000_000


def test_the_first_token_answers_the_rotation_value_it_was_made_with() -> None:
    step = plan(None, "2026-11", GRACE, T0, "t1")
    assert step.changed and step.events == (TokenEvent.CREATED,)
    assert step.state == TokenState(token="t1", generation=1, rotation="2026-11")
    assert step.accepted_hashes == (hash_token("t1"),)
    again = plan(step.state, "2026-11", GRACE, T0 + 1, "unused")
    assert not again.changed and again.events == () and again.state.token == "t1"


def test_a_new_value_rotates_and_keeps_the_previous_token_for_the_grace() -> None:
    made = plan(None, None, GRACE, T0, "t1").state
    step = plan(made, "r1", GRACE, T0 + 5, "t2")
    assert step.events == (TokenEvent.ROTATED,)
    assert step.state.token == "t2" and step.state.generation == 2
    assert step.state.rotated_at_ms == T0 + 5
    assert step.accepted_hashes == (hash_token("t2"), hash_token("t1"))
    assert step.previous_expires_at_ms == T0 + 5 + GRACE
    assert "t1" not in repr(step.state)  # the previous token is kept as its hash only
    during = plan(step.state, "r1", GRACE, T0 + 5 + GRACE - 1, "unused")
    assert not during.changed and len(during.accepted_hashes) == 2
    after = plan(step.state, "r1", GRACE, T0 + 5 + GRACE, "unused")
    assert after.changed and after.events == (TokenEvent.PREVIOUS_EXPIRED,)
    assert after.accepted_hashes == (hash_token("t2"),)
    assert after.previous_expires_at_ms is None
    assert after.state.generation == 2 and after.state.rotated_at_ms == T0 + 5


def test_clearing_the_value_rotates_nothing() -> None:
    made = plan(None, "r1", GRACE, T0, "t1").state
    step = plan(made, None, GRACE, T0 + 1, "t2")
    assert not step.changed and step.state.token == "t1"


def test_a_shorter_grace_applies_to_a_rotation_under_way_and_zero_refuses_at_once() -> None:
    rotated = plan(plan(None, None, GRACE, T0, "t1").state, "r1", GRACE, T0, "t2").state
    shortened = plan(rotated, "r1", 1_000, T0 + 1_000, "unused")
    assert shortened.events == (TokenEvent.PREVIOUS_EXPIRED,)
    leaked = plan(plan(None, None, 0, T0, "t1").state, "r1", 0, T0, "t2")
    assert leaked.events == (TokenEvent.ROTATED,)
    assert leaked.accepted_hashes == (hash_token("t2"),)
    assert leaked.state.previous_token_hash is None


def test_a_second_rotation_within_the_grace_drops_the_oldest_token() -> None:
    first = plan(plan(None, None, GRACE, T0, "t1").state, "r1", GRACE, T0, "t2").state
    second = plan(first, "r2", GRACE, T0 + 10, "t3")
    assert second.state.generation == 3
    assert second.accepted_hashes == (hash_token("t3"), hash_token("t2"))


def test_a_previous_token_without_its_time_is_not_trusted() -> None:
    odd = TokenState(token="t2", generation=2, previous_token_hash=hash_token("t1"))
    step = plan(odd, None, GRACE, T0, "unused")
    assert step.accepted_hashes == (hash_token("t2"),)


def test_a_negative_grace_is_refused() -> None:
    with pytest.raises(ValueError, match="grace_ms"):
        plan(None, None, -1, T0, "t1")


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 2 * GRACE), st.integers(0, GRACE)),
        max_size=30,
    )
)
def test_at_most_two_tokens_and_the_current_is_always_accepted(
    steps: list[tuple[int, int, int]],
) -> None:
    state: TokenState | None = None
    now = T0
    for number, (rotation, wait, grace) in enumerate(steps):
        now += wait
        step = plan(state, f"r{rotation}" if rotation else None, grace, now, f"t{number}")
        assert 1 <= len(step.accepted_hashes) <= 2
        assert step.accepted_hashes[0] == hash_token(step.state.token)
        if step.previous_expires_at_ms is not None:
            assert step.previous_expires_at_ms > now
        if state is not None:
            assert step.state.generation in (state.generation, state.generation + 1)
        state = step.state


def test_scram_credentials_follow_the_tokens_with_one_salt_per_user() -> None:
    """The brokers never see a token: each accepted token also comes as SCRAM credentials
    (SHA-256 and SHA-512) under the User's salt, the previous token's kept as credentials
    only, for its grace."""
    from headrace.security import scram

    salt = b"salt-of-the-user"

    def credentials(token: str) -> tuple[str, ...]:
        return tuple(scram.derive(m, token, salt).text() for m in scram.Mechanism)

    made = plan(None, None, GRACE, T0, "t1", scram_salt=salt)
    assert made.accepted_scram == credentials("t1")
    rotated = plan(made.state, "r1", GRACE, T0 + 5, "t2", scram_salt=salt)
    assert rotated.accepted_scram == credentials("t2") + credentials("t1")
    assert rotated.state.previous_scram == credentials("t1")
    after = plan(rotated.state, "r1", GRACE, T0 + 5 + GRACE, "unused", scram_salt=salt)
    assert after.accepted_scram == credentials("t2")
    assert after.state.previous_scram == ()
    # without a salt (no SCRAM for this User) the tokens are planned as before
    assert plan(None, None, GRACE, T0, "t1").accepted_scram == ()


def test_a_users_scram_salt_is_its_own_and_stable() -> None:
    from headrace.control.tokens import scram_salt

    assert scram_salt("ns/demo", "ns:writer") == scram_salt("ns/demo", "ns:writer")
    assert scram_salt("ns/demo", "ns:writer") != scram_salt("ns/demo", "ns:reader")
    assert scram_salt("ns/demo", "ns:writer") != scram_salt("ns/other", "ns:writer")
