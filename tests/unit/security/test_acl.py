"""The ACL file model and the pure matcher (headrace.security.acl)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import InvalidRequest
from headrace.security.acl import (
    BROKER_PRINCIPAL,
    Authorizer,
    Operation,
    PatternSet,
    Principal,
    canonical_pattern,
    hash_token,
    parse_acl,
    pattern_matches,
)

name_part = st.from_regex(r"[a-z0-9]([a-z0-9._-]{0,10}[a-z0-9])?", fullmatch=True)
topics = st.builds(lambda ns, n: f"{ns}/{n}", name_part, name_part)


def doc(*principals: dict[str, object]) -> dict[str, object]:
    return {"version": 1, "principals": list(principals)}


WRITER = {
    "name": "writer",
    "tokens": [hash_token("writer-secret")],
    "grants": [{"operations": ["produce"], "topics": ["default/orders*", "audit"]}],
}
OPS = {
    "name": "ops",
    "tokens": [hash_token("ops-secret")],
    "certificates": ["ops.example"],
    "grants": [{"operations": ["admin", "consume"], "topics": ["*"]}],
}


# ------------------------------------------------------------------ patterns


@given(topics)
def test_star_matches_every_topic(topic: str) -> None:
    assert pattern_matches("*", topic)


@given(topics, topics)
def test_a_literal_matches_only_itself(pattern: str, topic: str) -> None:
    assert pattern_matches(pattern, topic) == (pattern == topic)


@given(topics, st.integers(min_value=0, max_value=30))
def test_a_prefix_matches_exactly_the_names_that_start_with_it(topic: str, cut: int) -> None:
    prefix = topic[:cut]
    assert pattern_matches(prefix + "*", topic)
    assert not pattern_matches(topic + "x*", topic)


def test_a_namespace_prefix_does_not_reach_a_longer_namespace() -> None:
    assert pattern_matches("team-a/*", "team-a/orders")
    assert not pattern_matches("team-a/*", "team-ab/orders")


def test_patterns_take_the_default_namespace_like_topic_names() -> None:
    assert canonical_pattern("orders") == "default/orders"
    assert canonical_pattern("team/orders") == "team/orders"
    assert canonical_pattern("orders*") == "default/orders*"
    assert canonical_pattern("team-a/*") == "team-a/*"
    assert canonical_pattern("*") == "*"


@pytest.mark.parametrize("bad", ["", "a*b", "**", "*a", "team/*/x*"])
def test_a_star_anywhere_but_last_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="pattern"):
        canonical_pattern(bad)


# ------------------------------------------------------------------ principals


def test_grants_are_per_operation() -> None:
    acl = parse_acl(doc(WRITER, OPS))
    writer = Principal.from_spec(acl.principals[0])
    assert writer.allows(Operation.PRODUCE, "default/orders-eu")
    assert writer.allows(Operation.PRODUCE, "default/audit")
    assert not writer.allows(Operation.PRODUCE, "default/payments")
    assert not writer.allows(Operation.CONSUME, "default/orders-eu")
    assert not writer.allows(Operation.ADMIN, "default/orders-eu")
    assert not writer.allows(Operation.CLUSTER)


@given(st.lists(st.sampled_from(list(Operation)), min_size=1, unique=True), topics)
def test_a_principal_may_do_exactly_what_it_was_granted(
    granted: list[Operation], topic: str
) -> None:
    spec = {
        "name": "p",
        "tokens": [hash_token("t")],
        "grants": [{"operations": [op.value for op in granted], "topics": ["*"]}],
    }
    principal = Principal.from_spec(parse_acl(doc(spec)).principals[0])
    for op in Operation:
        assert principal.allows(op, topic) == (op in granted)


def test_authenticate_by_token_or_certificate() -> None:
    auth = Authorizer(parse_acl(doc(WRITER, OPS)), broker_tokens=["replication"])
    writer = auth.authenticate("writer-secret", None)
    assert writer is not None and writer.name == "writer"
    by_cert = auth.authenticate(None, "ops.example")
    assert by_cert is not None and by_cert.name == "ops"
    assert auth.authenticate("wrong", None) is None
    assert auth.authenticate(None, None) is None
    assert auth.authenticate(None, "stranger") is None
    # a token and a certificate naming two principals: refused
    assert auth.authenticate("writer-secret", "ops.example") is None
    ops = auth.authenticate("ops-secret", "ops.example")
    assert ops is not None and ops.name == "ops"
    broker = auth.authenticate("replication", None)
    assert broker is not None and broker.name == BROKER_PRINCIPAL
    assert broker.allows(Operation.CLUSTER)
    assert not broker.allows(Operation.PRODUCE, "default/orders")


# ------------------------------------------------------------------ file validation


@pytest.mark.parametrize(
    ("principal", "complaint"),
    [
        ({"name": "p", "tokens": ["plain-secret-token"]}, "sha256"),
        ({"name": "p"}, "no tokens, certificates or SCRAM credentials"),
        ({"name": "bad name", "tokens": [hash_token("x")]}, "principal name"),
        ({"name": BROKER_PRINCIPAL, "tokens": [hash_token("x")]}, "reserved"),
        (
            {"name": "p", "tokens": [hash_token("x")], "grants": [{"operations": ["produce"]}]},
            "needs topic patterns",
        ),
        (
            {
                "name": "p",
                "tokens": [hash_token("x")],
                "grants": [{"operations": ["read"], "topics": ["*"]}],
            },
            "operations",
        ),
        ({"name": "p", "tokens": [hash_token("x")], "colour": "red"}, "colour"),
    ],
)
def test_bad_files_are_refused_with_a_typed_error(
    principal: dict[str, object], complaint: str
) -> None:
    with pytest.raises(InvalidRequest, match=complaint) as info:
        parse_acl(doc(principal), "acl.yaml")
    assert "plain-secret-token" not in info.value.message  # a pasted secret is never echoed


def test_duplicates_are_refused_without_showing_the_hash() -> None:
    twin = {**WRITER, "name": "twin"}
    with pytest.raises(InvalidRequest, match="token hash") as info:
        parse_acl(doc(WRITER, twin))
    assert hash_token("writer-secret") not in info.value.message
    with pytest.raises(InvalidRequest, match="principal name"):
        parse_acl(doc(WRITER, WRITER))


def test_only_version_1_is_understood() -> None:
    with pytest.raises(InvalidRequest, match="version"):
        parse_acl({"version": 2, "principals": []})


def test_cohort_patterns_narrow_a_consume_grant() -> None:
    spec = {
        "name": "tenant",
        "tokens": [hash_token("t")],
        "grants": [
            {"operations": ["consume"], "topics": ["shared"], "cohorts": ["tenant-*", "audit"]},
            {"operations": ["consume"], "topics": ["team/*"]},
        ],
    }
    tenant = Principal.from_spec(parse_acl(doc(spec)).principals[0])
    assert tenant.may_join("default/shared", "tenant-readers")
    assert tenant.may_join("default/shared", "audit")
    assert not tenant.may_join("default/shared", "other-readers")
    assert tenant.may_join("team/anything", "any-cohort")  # no cohorts: every cohort
    assert not tenant.may_join("default/elsewhere", "tenant-readers")
    assert tenant.allows(Operation.CONSUME, "default/shared")  # plain reads are not narrowed


def test_cohorts_only_narrow_consume() -> None:
    spec = {
        "name": "p",
        "tokens": [hash_token("t")],
        "grants": [{"operations": ["produce"], "topics": ["*"], "cohorts": ["x"]}],
    }
    with pytest.raises(InvalidRequest, match="no consume"):
        parse_acl(doc(spec))


@given(
    st.lists(st.sampled_from(["*", "default/*", "default/orders*", "team/x", "orders", "t*"])),
    topics,
)
def test_the_compiled_pattern_set_agrees_with_the_one_pattern_rule(
    patterns: list[str], topic: str
) -> None:
    canonical = [canonical_pattern(p) for p in patterns]
    expected = any(pattern_matches(p, topic) for p in canonical)
    assert PatternSet.of(canonical).matches(topic) == expected


def test_the_replication_token_may_not_double_as_a_principals_token() -> None:
    with pytest.raises(InvalidRequest, match="replication token"):
        Authorizer(parse_acl(doc(WRITER)), broker_tokens=["writer-secret"])


# ------------------------------------------------------------------ SCRAM credentials


def test_a_principal_may_authenticate_by_scram_credentials_alone() -> None:
    from headrace.security import scram

    credential = scram.derive(scram.Mechanism.SCRAM_SHA_512, "app-secret", b"salt-of-app")
    parsed = parse_acl(
        doc(
            {
                "name": "app",
                "scram": [credential.text()],
                "grants": [{"operations": ["produce"], "topics": ["*"]}],
            }
        )
    )
    authorizer = Authorizer(parsed)
    assert authorizer.scram_credentials("app") == (credential,)
    assert authorizer.scram_credentials("nobody") == ()
    principal = authorizer.for_scram("app", credential, None)
    assert principal is not None and principal.name == "app"
    other = scram.derive(scram.Mechanism.SCRAM_SHA_512, "another", b"salt-of-app")
    assert authorizer.for_scram("app", other, None) is None


def test_a_bad_scram_credential_is_refused_without_echoing_it() -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_acl(doc({**WRITER, "scram": ["SCRAM-SHA-512:4096:c2FsdA==:c2VjcmV0:c2VjcmV0"]}))
    assert "c2VjcmV0" not in refused.value.message
    assert "principals.0.scram" in refused.value.message


def test_scram_and_a_certificate_must_name_the_same_principal() -> None:
    from headrace.security import scram

    credential = scram.derive(scram.Mechanism.SCRAM_SHA_256, "writer-secret", b"salt")
    authorizer = Authorizer(parse_acl(doc({**WRITER, "scram": [credential.text()]}, OPS)))
    assert authorizer.for_scram("writer", credential, "ops.example") is None
    assert authorizer.for_scram("writer", credential, "unknown.example") is not None
