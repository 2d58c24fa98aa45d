"""``Access.reload``: a good file replaces the grants and open sessions catch up at their
next check; a bad one changes nothing and is counted (headrace.security.access)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from headrace.errors import (
    AuthenticationFailed,
    InvalidMemberIdentity,
    InvalidRequest,
    ProduceDenied,
)
from headrace.security.access import Access, load_cluster_keys
from headrace.security.acl import Operation, hash_token
from headrace.security.settings import AccessSettings


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
    # no cluster key: the grants alone, as the controller's API checks them
    access = Access(AccessSettings(acl_file=acl_file), denials, reloads=reloads)
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


# ---------------------------------------------------------------------------- token and key files


def test_a_token_file_reloads_for_open_sessions(tmp_path: Path) -> None:
    """Shared tokens from ``--auth-token-file``: an added token authenticates at once, a
    removed one is refused at the next check of a session opened with it."""
    tokens = tmp_path / "tokens"
    tokens.write_text("first-token\n")
    denials, reloads = Labels(), Labels()
    settings = AccessSettings(auth_tokens=frozenset({"option-token"}), auth_token_file=tokens)
    access = Access(settings, denials, reloads=reloads)
    assert access.asks_credentials and not access.enabled
    first = access.session()
    first.authenticate("first-token", None)
    with pytest.raises(AuthenticationFailed):
        access.session().authenticate("second-token", None)

    tokens.write_text("second-token\n")
    assert access.reload_if_changed()
    access.session().authenticate("second-token", None)
    access.session().authenticate("option-token", None)  # the options' tokens stay
    with pytest.raises(AuthenticationFailed, match="no longer accepted"):
        first.require(Operation.PRODUCE, "orders")
    assert reloads.by_labels == {("auth_tokens", "ok"): 1}

    tokens.write_text("")  # an empty file would lock everyone out: refused
    assert not access.reload()
    access.session().authenticate("second-token", None)
    assert access.files.status()["auth_tokens"]["reload_error"] == (
        f"the token file {tokens} holds no value (one per line; the first is the one in use)"
    )
    assert reloads.by_labels[("auth_tokens", "error")] == 1


def test_the_replication_token_file_rotates(tmp_path: Path) -> None:
    """Every listed replication token authenticates as the brokers (ACL mode) and the
    first is the one presented; removing one revokes it."""
    acl_file = tmp_path / "acl.yaml"
    acl_file.write_text(acl_doc(("writer", "w-token", ["produce"])))
    replication = tmp_path / "replication.token"
    replication.write_text("old-replication\n")
    access = Access(
        AccessSettings(
            acl_file=acl_file,
            replication_token="ignored-when-the-file-is-given",
            replication_token_file=replication,
        ),
        Labels(),
        reloads=Labels(),
    )
    assert access.replication_token == "old-replication"
    follower = access.session()
    follower.authenticate("old-replication", None)
    follower.require_cluster()

    replication.write_text("old-replication\nnew-replication\n")  # step 1: both accepted
    assert access.reload()
    assert access.replication_token == "old-replication"
    access.session().authenticate("new-replication", None)
    replication.write_text("new-replication\nold-replication\n")  # step 2: the new is sent
    assert access.reload()
    assert access.replication_token == "new-replication"
    follower.require_cluster()  # still accepted
    replication.write_text("new-replication\n")  # step 3
    assert access.reload()
    with pytest.raises(AuthenticationFailed):
        follower.require_cluster()

    # a replication token that is also a principal's token is refused: nothing changes
    replication.write_text("w-token\n")
    access.reload()  # SIGHUP: every file; the ACL file reads well, this one not
    assert access.replication_token == "new-replication"
    assert "also a principal's token" in (access.files.error("replication_token") or "")
    assert "w-token" not in (access.files.error("replication_token") or "")


def test_the_cluster_key_file_rotates(tmp_path: Path) -> None:
    """The first key signs; an identity signed with a key still listed verifies; a bad
    file (or a key made readable by others) keeps the keys in force."""
    acl_file = tmp_path / "acl.yaml"
    acl_file.write_text(acl_doc(("writer", "w-token", ["consume"])))
    key_file = tmp_path / "cluster.key"
    old, new = "11" * 32, "22" * 32
    key_file.write_text(old + "\n")
    key_file.chmod(0o600)
    reloads = Labels()
    access = Access(
        AccessSettings(acl_file=acl_file, cluster_key_file=key_file),
        Labels(),
        reloads=reloads,
    )
    member = access.session()
    member.authenticate("w-token", None)
    member_id, old_identity = member.issue_identity("worker")

    key_file.write_text(f"{new}\n{old}\n")  # steps 1 and 2 at once, for one broker
    assert access.reload_if_changed()
    assert access.key == bytes.fromhex(new)
    member.verify_member(member_id, old_identity)  # still accepted
    new_id, new_identity = member.issue_identity("worker")
    member.verify_member(new_id, new_identity)

    for bad, mode in ((f"{new}\nnot-a-key\n", 0o600), (f"{new}\n", 0o644)):
        key_file.write_text(bad)
        key_file.chmod(mode)
        assert not access.reload_if_changed()
        member.verify_member(member_id, old_identity)  # the keys in force stay
    assert "chmod 600" in (access.files.error("cluster_key") or "")
    key_file.chmod(0o600)  # a chmod is a change too
    assert access.reload_if_changed()  # step 3: the old key is gone
    with pytest.raises(InvalidMemberIdentity):
        member.verify_member(member_id, old_identity)
    member.verify_member(new_id, new_identity)
    assert reloads.by_labels == {("cluster_key", "ok"): 2, ("cluster_key", "error"): 2}
    assert access.files.error("cluster_key") is None


def test_an_acl_file_that_is_not_utf8_keeps_the_grants_in_force(
    setup: tuple[Access, Path, Labels, Labels],
) -> None:
    # UnicodeDecodeError is no HeadraceError: it escaped the reload and ended the broker's
    # watch task for good (no later change of any credential file was read again)
    access, acl_file, _, reloads = setup
    writer = access.session()
    writer.authenticate("w-token", None)
    acl_file.write_bytes(b"\xff\xfe" + acl_doc(("writer", "w-token", [])).encode())
    assert not access.reload_if_changed()
    assert access.reload_error is not None and "UTF-8" in access.reload_error
    assert reloads.counts == {"error": 1}
    writer.require(Operation.PRODUCE, "orders")


def test_a_session_refused_at_its_catch_up_stays_refused(
    setup: tuple[Access, Path, Labels, Labels],
) -> None:
    """A reload that drops a session's principal refuses it at every later check, not
    only the first: the session is marked current only after it passes."""
    access, acl_file, denials, _ = setup
    writer = access.session()
    writer.authenticate("w-token", None)
    writer.require(Operation.PRODUCE, "orders")
    acl_file.write_text(acl_doc(("ops", "o-token", ["admin"])))
    assert access.reload()
    for _ in range(2):
        with pytest.raises(AuthenticationFailed, match="no longer valid"):
            writer.require(Operation.PRODUCE, "orders")
        assert writer.stale
    assert denials.counts["authenticate"] == 2
    # put back: the next check catches up and passes
    acl_file.write_text(acl_doc(("writer", "w-token", ["produce"]), ("ops", "o-token", ["admin"])))
    assert access.reload()
    writer.require(Operation.PRODUCE, "orders")
    assert not writer.stale


def test_a_scram_session_is_refused_once_its_credential_is_gone(tmp_path: Path) -> None:
    from headrace.security import scram

    old = scram.derive(scram.Mechanism.SCRAM_SHA_512, "old-token", b"salt")
    new = scram.derive(scram.Mechanism.SCRAM_SHA_512, "new-token", b"salt")

    def write(*credentials: scram.ScramCredential) -> None:
        acl_file.write_text(
            json.dumps(
                {
                    "version": 1,
                    "principals": [
                        {
                            "name": "writer",
                            "scram": [c.text() for c in credentials],
                            "grants": [{"operations": ["produce"], "topics": ["*"]}],
                        }
                    ],
                }
            )
        )

    acl_file = tmp_path / "acl.yaml"
    write(old, new)
    access = Access(AccessSettings(acl_file=acl_file), Labels(), reloads=Labels())
    session = access.session()
    session.authenticate_scram("writer", old, None)
    assert session.principal is not None and session.principal.name == "writer"
    session.require(Operation.PRODUCE, "orders")

    write(new)  # the old token's credential is rotated away
    assert access.reload()
    with pytest.raises(AuthenticationFailed):
        session.require(Operation.PRODUCE, "orders")

    fresh = access.session()
    with pytest.raises(AuthenticationFailed):
        fresh.authenticate_scram("writer", old, None)
    fresh.authenticate_scram("writer", new, None)


def test_a_cluster_key_readable_by_this_process_group_only_is_accepted(tmp_path: Path) -> None:
    """A Kubernetes Secret volume's files are ``root:<fsGroup> 0440`` once the pod has an
    ``fsGroup``: the broker, in that group, must read its key; another group's or anyone's
    read access is still refused."""
    key = "ab" * 32
    key_file = tmp_path / "cluster.key"
    key_file.write_text(f"{key}\n")
    os.chown(key_file, -1, os.getegid())
    key_file.chmod(0o440)
    assert load_cluster_keys(key_file) == (bytes.fromhex(key),)
    for mode in (0o460, 0o444, 0o404):
        key_file.chmod(mode)
        with pytest.raises(InvalidRequest, match="chmod 600"):
            load_cluster_keys(key_file)
    if os.geteuid() == 0:  # only root can give the file a group this process is not in
        os.chown(key_file, -1, max([*os.getgroups(), os.getegid()]) + 1)
        key_file.chmod(0o440)
        with pytest.raises(InvalidRequest, match="another group"):
            load_cluster_keys(key_file)
