"""Signing and verifying member identity tokens (headrace.security.identities)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.cohorts.gates import validate_member_id
from headrace.errors import InvalidMemberIdentity, InvalidRequest
from headrace.security import identities as ids

KEY = bytes(range(32))
OTHER_KEY = bytes(32)
names = st.text(min_size=1, max_size=40)


def issue(principal: str = "tenant-a", member: str = "worker.0123", cluster: str = "c1") -> str:
    return ids.sign(KEY, ids.MemberIdentity(cluster, principal, member, 1_700_000_000_000))


@given(names, names, names, st.integers(min_value=0, max_value=2**53))
def test_a_signed_identity_verifies_for_exactly_what_it_binds(
    cluster: str, principal: str, member: str, issued: int
) -> None:
    identity = ids.MemberIdentity(cluster, principal, member, issued)
    token = ids.sign(KEY, identity)
    assert (
        ids.verify(KEY, token, cluster_id=cluster, principal=principal, member_id=member)
        == identity
    )
    with pytest.raises(InvalidMemberIdentity):
        ids.verify(KEY, token, cluster_id=cluster, principal=principal + "x", member_id=member)
    with pytest.raises(InvalidMemberIdentity):
        ids.verify(KEY, token, cluster_id=cluster, principal=principal, member_id=member + "x")
    with pytest.raises(InvalidMemberIdentity):
        ids.verify(KEY, token, cluster_id=cluster + "x", principal=principal, member_id=member)
    with pytest.raises(InvalidMemberIdentity, match="signature"):
        ids.verify(OTHER_KEY, token, cluster_id=cluster, principal=principal, member_id=member)


def _decoded(token: str) -> list[bytes] | None:
    """A token's parts as bytes (base64 has slack in a last character's low bits)."""
    try:
        return [p.encode() if i == 0 else ids._unb64(p) for i, p in enumerate(token.split("."))]
    except ValueError:
        return None


@given(st.data())
def test_any_change_to_a_token_is_refused(data: st.DataObject) -> None:
    token = issue()
    at = data.draw(st.integers(min_value=0, max_value=len(token) - 1))
    replacement = data.draw(st.sampled_from("AQgw_-.xZ9="))
    tampered = token[:at] + replacement + token[at + 1 :]
    if _decoded(tampered) == _decoded(token):
        return  # the same bytes: still the genuine token
    with pytest.raises(InvalidMemberIdentity) as info:
        ids.verify(KEY, tampered, cluster_id="c1", principal="tenant-a", member_id="worker.0123")
    assert tampered not in info.value.message  # a credential is never echoed


def test_a_token_of_another_principal_does_not_transfer() -> None:
    """The spoof: tenant-b presents tenant-a's token (or its own) for tenant-a's member id."""
    a_token = issue("tenant-a", "worker.aaaa")
    b_token = issue("tenant-b", "worker.bbbb")
    for token in (a_token, b_token):
        with pytest.raises(InvalidMemberIdentity, match="not bound"):
            ids.verify(KEY, token, cluster_id="c1", principal="tenant-b", member_id="worker.aaaa")


@pytest.mark.parametrize("junk", ["", "hri1", "hri1..", "hri2.e30.AAAA", "hri1.e30.!!!!", "x.y.z"])
def test_junk_is_malformed(junk: str) -> None:
    with pytest.raises(InvalidMemberIdentity, match=r"malformed|signature"):
        ids.verify(KEY, junk, cluster_id="c1", principal="p", member_id="m")


@given(st.text(max_size=300))
def test_issued_member_ids_are_valid_member_ids(hint: str) -> None:
    member = ids.member_id_for(hint, "f" * ids.RANDOM_HEX)
    assert validate_member_id(member) == member
    assert member.endswith("." + "f" * ids.RANDOM_HEX)


def test_the_hint_stays_readable() -> None:
    assert ids.member_id_for("orders-reader-1", "ab" * 16) == "orders-reader-1." + "ab" * 16
    assert ids.member_id_for("", "ab" * 16).startswith("member.")


def test_key_parsing() -> None:
    assert ids.parse_key("00" * 32 + "\n") == bytes(32)
    with pytest.raises(InvalidRequest, match="hex"):
        ids.parse_key("not hex")
    with pytest.raises(InvalidRequest, match="32 bytes"):
        ids.parse_key("00" * 16)
