"""One reload path for every credential file (headrace.security.reloading): only changed
files are re-read, a refused file changes nothing, and each file keeps its own error and
generation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from headrace.errors import HeadraceError, InvalidRequest
from headrace.security import keyrings
from headrace.security.access import load_token_file
from headrace.security.reloading import CredentialFiles
from tests.unit.security.test_access_reload import Labels


def read_tokens(path: Path) -> tuple[str, ...]:
    return keyrings.parse_tokens(path.read_text(), path.name)


def test_only_changed_files_are_read_again_and_errors_stay_per_file(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("a1\n")
    b.write_text("b1\n")
    in_force: dict[str, tuple[str, ...]] = {}
    reloads, bumps = Labels(), []
    files = CredentialFiles(reloads, lambda: bumps.append(1))
    files.watch("a", a, read_tokens, lambda v: in_force.__setitem__("a", v))
    files.watch("b", b, read_tokens, lambda v: in_force.__setitem__("b", v))
    assert in_force == {"a": ("a1",), "b": ("b1",)} and not bumps  # start-up is no reload

    assert not files.reload_if_changed()
    b.write_text("b2\nb1\n")
    assert files.reload_if_changed()
    assert in_force["b"] == ("b2", "b1") and reloads.by_labels == {("b", "ok"): 1}

    # a half-written file (here: empty) is refused; the whole file is read at the next stat
    a.write_text("")
    assert not files.reload_if_changed()
    assert in_force["a"] == ("a1",)
    assert (
        files.status()["a"]["reload_error"]
        == "a holds no value (one per line; the first is the one in use)"
    )
    assert files.status()["b"]["reload_error"] is None
    a.write_text("a2\n")
    assert files.reload_if_changed()
    assert in_force["a"] == ("a2",) and files.error("a") is None
    assert (files.generation("a"), files.generation("b")) == (1, 1)
    assert reloads.by_labels == {("b", "ok"): 1, ("a", "error"): 1, ("a", "ok"): 1}
    assert len(bumps) == 2

    # a rename with the same size and content is a change too (the kubelet's swap)
    tmp = tmp_path / "a.new"
    tmp.write_text("a2\n")
    os.replace(tmp, a)
    assert files.reload_if_changed()
    assert files.generation("a") == 2


def test_a_refused_apply_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("good\n")
    in_force: list[tuple[str, ...]] = []

    def apply(tokens: tuple[str, ...]) -> None:
        if "forbidden" in tokens:
            raise InvalidRequest("refused by the caller")
        in_force.append(tokens)

    files = CredentialFiles(None, lambda: None)
    files.watch("tokens", path, read_tokens, apply)
    path.write_text("forbidden\n")
    assert not files.reload()
    assert in_force == [("good",)] and files.error("tokens") == "refused by the caller"


def test_a_missing_file_at_start_up_raises_one_typed_error(tmp_path: Path) -> None:
    files = CredentialFiles(None, lambda: None)
    with pytest.raises(HeadraceError, match=r"cannot read the token file .*missing"):
        files.watch("tokens", tmp_path / "missing", load_token_file, lambda v: None)


def test_an_unexpected_error_is_a_failed_re_read_not_the_end_of_the_watch(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens"
    path.write_text("good\n")
    in_force: list[tuple[str, ...]] = []

    def read(p: Path) -> tuple[str, ...]:
        if "boom" in p.read_text():
            raise RuntimeError("secret-looking detail")
        return read_tokens(p)

    files = CredentialFiles(None, lambda: None)
    files.watch("tokens", path, read, in_force.append)
    path.write_text("boom\n")
    assert not files.reload_if_changed()
    error = files.error("tokens")
    assert error is not None and "RuntimeError" in error and "secret" not in error
    path.write_text("next\n")
    assert files.reload_if_changed()
    assert in_force == [("good",), ("next",)] and files.error("tokens") is None
