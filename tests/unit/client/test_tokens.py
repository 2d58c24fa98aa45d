"""``tokens.TokenFile``: a client's token read from a file in the brokers' token-file
format at each call, so a long-lived client follows a rotation."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.client import tokens
from headrace.client.connection import ConnectOptions
from headrace.errors import InvalidRequest


def test_the_first_token_line_is_the_one_presented_and_is_read_at_each_call(
    tmp_path: Path,
) -> None:
    path = tmp_path / "client.token"
    path.write_text("# rotated on Monday\n\n  first-token  \nsecond-token\n")
    source = tokens.TokenFile(path)
    assert source() == "first-token"
    path.write_text("second-token\nfirst-token\n")  # step 2 of a rotation: swapped
    assert source() == "second-token"


def test_a_file_unreadable_or_malformed_at_the_first_call_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "client.token"
    with pytest.raises(InvalidRequest, match="cannot read the token file"):
        tokens.TokenFile(path)()
    path.write_text("# only a comment\n")
    with pytest.raises(InvalidRequest, match="holds no value"):
        tokens.TokenFile(path)()
    path.write_text("a-token\na-token\n")
    with pytest.raises(InvalidRequest, match="line 2 repeats line 1"):
        tokens.TokenFile(path)()
    path.write_text("a token with blanks\n")
    with pytest.raises(InvalidRequest, match="line 1 is not a token") as refused:
        tokens.TokenFile(path)()
    assert "a token with blanks" not in refused.value.message  # never the value


def test_a_file_caught_mid_rewrite_keeps_the_last_good_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "client.token"
    path.write_text("first-token\n")
    source = tokens.TokenFile(path)
    assert source() == "first-token"
    path.write_text("")  # truncated, not yet written
    assert source() == "first-token"
    path.unlink()
    assert source() == "first-token"
    assert "keeping the token read before" in caplog.text
    assert "first-token" not in caplog.text
    path.write_text("second-token\n")
    assert source() == "second-token"


def test_connect_options_take_a_string_or_a_source() -> None:
    assert tokens.current_token(None) is None
    assert tokens.current_token("fixed") == "fixed"
    calls = iter(["one", "two"])
    options = ConnectOptions(auth_token=lambda: next(calls))
    assert tokens.current_token(options.auth_token) == "one"
    assert tokens.current_token(options.auth_token) == "two"
    assert repr(tokens.TokenFile("/run/secrets/token")) == "TokenFile('/run/secrets/token')"
