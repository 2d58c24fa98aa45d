"""The User kind: validated by the brokers' own grant rules, rendered into an ACL entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.resources import ManifestError, User, load_manifests
from headrace.security.acl import AclFile, Authorizer, Operation, hash_token

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "user.yaml"


def user(authentication: str, grants: str) -> str:
    return f"""apiVersion: headrace.dev/v1alpha1
kind: User
metadata: {{name: app, namespace: team}}
spec:
  clusterRef: {{name: main}}
  authentication: {authentication}
  authorization:
    grants: {grants}
"""


def test_the_example_renders_into_an_acl_entry_the_brokers_accept() -> None:
    (resource,) = load_manifests(EXAMPLE.read_text())
    assert isinstance(resource, User)
    entry = resource.acl_principal([hash_token("secret")])
    assert entry.name == "default:orders-service"
    principal = Authorizer(AclFile(principals=[entry])).authenticate("secret", None)
    assert principal is not None
    assert principal.allows(Operation.PRODUCE, "default/orders-eu")
    assert not principal.allows(Operation.ADMIN, "default/orders-eu")
    assert principal.may_join("default/orders", "orders-readers")
    assert not principal.may_join("default/orders", "billing")


def test_a_tls_user_is_its_certificate_common_name() -> None:
    (resource,) = load_manifests(
        user("{type: tls}", "[{operations: [consume], topics: ['team/*']}]")
    )
    assert isinstance(resource, User)
    entry = resource.acl_principal()
    assert (entry.certificates, entry.tokens) == (["app"], [])


@pytest.mark.parametrize(
    ("grants", "complaint"),
    [
        ("[{operations: [consume], topics: ['a*b']}]", "'\\*' may appear once"),
        ("[{operations: [produce], topics: ['*'], cohorts: [x]}]", "no consume"),
        ("[{operations: [cluster], topics: ['*']}]", "operations"),
        ("[{operations: [produce], topics: []}]", "topics"),
    ],
)
def test_bad_grants_are_field_errors(grants: str, complaint: str) -> None:
    with pytest.raises(ManifestError, match=complaint):
        load_manifests(user("{type: token}", grants))
