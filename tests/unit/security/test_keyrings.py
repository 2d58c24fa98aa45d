"""Keyrings: token and key files with several values in force, the current one first
(headrace.security.keyrings), and identities verified under any key in force."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import InvalidMemberIdentity, InvalidRequest
from headrace.security import identities as ids
from headrace.security import keyrings

OLD_KEY, NEW_KEY = bytes(range(32)), bytes(range(32, 64))
visible = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1)


def test_tokens_come_in_file_order_without_blanks_and_comments() -> None:
    text = "# rotated 2026-11-24\n\n  new-token-1  \nold-token-0\n# the end\n"
    assert keyrings.parse_tokens(text) == ("new-token-1", "old-token-0")
    assert keyrings.parse_tokens("only\n") == ("only",)
    assert keyrings.parse_tokens("no-newline") == ("no-newline",)


@given(st.lists(visible.filter(lambda t: not t.startswith("#")), min_size=1, unique=True))
def test_any_list_of_distinct_tokens_reads_back(tokens: list[str]) -> None:
    assert keyrings.parse_tokens("\n".join(tokens) + "\n") == tuple(tokens)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no value"),
        ("\n  \n# only a comment\n", "holds no value"),
        ("good-token\nsecret with-blank\n", "line 2 is not a token"),
        ("g\u00e9n\u00e9ral-secret\n", "line 1 is not a token"),
        ("t" * 4097, "line 1 is not a token"),
        ("same-secret\nother\nsame-secret\n", "line 3 repeats line 1"),
    ],
)
def test_a_bad_token_file_is_refused_without_echoing_a_value(text: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message) as refused:
        keyrings.parse_tokens(text, "the token file t")
    assert "secret" not in refused.value.message
    assert refused.value.message.startswith("the token file t")


def test_keys_come_in_file_order() -> None:
    text = (
        f"{NEW_KEY.hex()}\n# the old one, until every broker signs with the new\n{OLD_KEY.hex()}\n"
    )
    assert keyrings.parse_keys(text) == (NEW_KEY, OLD_KEY)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no value"),
        (f"{NEW_KEY.hex()}\nnot-hex\n", "line 2: the cluster key file does not hold hex"),
        (f"{NEW_KEY.hex()[:-2]}\n", "line 1: the cluster key must be 32 bytes"),
        (f"{NEW_KEY.hex()}\n{NEW_KEY.hex().upper()}\n", "line 2 repeats line 1"),
    ],
)
def test_a_bad_key_file_is_refused_without_echoing_a_key(text: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message) as refused:
        keyrings.parse_keys(text)
    assert NEW_KEY.hex() not in refused.value.message.lower()


def test_an_identity_verifies_under_any_key_in_force_and_not_once_its_key_is_gone() -> None:
    identity = ids.MemberIdentity("c1", "tenant-a", "worker.0123", 1)
    old_token = ids.sign(OLD_KEY, identity)
    check = {"cluster_id": "c1", "principal": "tenant-a", "member_id": "worker.0123"}
    assert ids.verify((OLD_KEY,), old_token, **check) == identity
    # rotation steps 1 and 2: both keys in force, in either order
    assert ids.verify((OLD_KEY, NEW_KEY), old_token, **check) == identity
    assert ids.verify((NEW_KEY, OLD_KEY), old_token, **check) == identity
    assert ids.verify((NEW_KEY, OLD_KEY), ids.sign(NEW_KEY, identity), **check) == identity
    # step 3: the old key removed revokes what it signed
    with pytest.raises(InvalidMemberIdentity, match="signature"):
        ids.verify((NEW_KEY,), old_token, **check)
    with pytest.raises(InvalidMemberIdentity, match="signature"):
        ids.verify((), old_token, **check)
