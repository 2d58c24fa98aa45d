"""The options every client command shares (``cli.options``): no broker needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from headrace.cli import options
from headrace.cli.main import main
from headrace.cli.options import ClientTarget, client_options


def _record(directory: Path, hosts: list[str], port: int = 9092) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    brokers = [{"id": i, "host": h, "port": port} for i, h in enumerate(hosts)]
    (directory / "local.json").write_text(json.dumps({"brokers": brokers}))


@click.command()
@client_options
def show(client: ClientTarget) -> None:
    click.echo(json.dumps({"bootstrap": client.bootstrap, "token": client.auth_token}))
    click.echo(f"tls={client.tls is not None}")


def test_bootstrap_comes_from_the_flag_then_the_environment_then_the_local_cluster(
    tmp_path: Path,
) -> None:
    local_dir = tmp_path / "local"
    _record(local_dir, ["127.0.0.2", "127.0.0.3"], 19092)
    runner = CliRunner()
    by_dir = runner.invoke(show, ["--dir", str(local_dir)], env={"HEADRACE_BOOTSTRAP": None})
    assert json.loads(by_dir.output.splitlines()[0])["bootstrap"] == (
        "127.0.0.2:19092,127.0.0.3:19092"
    )
    by_env = runner.invoke(
        show, ["--dir", str(local_dir)], env={"HEADRACE_BOOTSTRAP": "10.0.0.1:9092"}
    )
    assert json.loads(by_env.output.splitlines()[0])["bootstrap"] == "10.0.0.1:9092"
    by_flag = runner.invoke(
        show,
        ["--dir", str(local_dir), "--bootstrap", "h:1"],
        env={"HEADRACE_BOOTSTRAP": "10.0.0.1:9092"},
    )
    assert json.loads(by_flag.output.splitlines()[0])["bootstrap"] == "h:1"
    nothing = runner.invoke(
        show, ["--dir", str(tmp_path / "none")], env={"HEADRACE_BOOTSTRAP": None}
    )
    assert json.loads(nothing.output.splitlines()[0])["bootstrap"] == options.FALLBACK_BOOTSTRAP


def test_a_token_comes_from_the_environment() -> None:
    result = CliRunner().invoke(show, ["--bootstrap", "h:1"], env={"HEADRACE_AUTH_TOKEN": "s3"})
    assert json.loads(result.output.splitlines()[0])["token"] == "s3"


@click.command()
@client_options
def show_source(client: ClientTarget) -> None:
    """What the connections present: the source's token now, and then after a rotation."""
    source = client.connect_options().auth_token
    click.echo(json.dumps({"token": client.auth_token, "file": str(client.auth_token_file)}))
    if callable(source):
        assert client.auth_token_file is not None
        client.auth_token_file.write_text("rotated-token\n")
        click.echo(f"{source()} then {source()}")
    else:
        click.echo(f"fixed {source}")


def test_a_token_file_is_read_again_at_each_connect(tmp_path: Path) -> None:
    path = tmp_path / "client.token"
    path.write_text("# the client's token\nfile-token\nolder-token\n")
    runner = CliRunner()
    for args, env in (
        (["--auth-token-file", str(path)], {"HEADRACE_AUTH_TOKEN_FILE": None}),
        ([], {"HEADRACE_AUTH_TOKEN_FILE": str(path)}),
    ):
        path.write_text("file-token\n")
        result = runner.invoke(show_source, args, env={"HEADRACE_AUTH_TOKEN": None, **env})
        assert result.exit_code == 0, result.output
        shown, presented = result.output.splitlines()
        # the token it holds at start, for the controller's API
        assert json.loads(shown) == {"token": "file-token", "file": str(path)}
        assert presented == "rotated-token then rotated-token"


def test_a_token_and_a_token_file_one_on_the_command_line_wins(tmp_path: Path) -> None:
    path = tmp_path / "client.token"
    path.write_text("file-token\n")
    runner = CliRunner()
    flag_over_file_env = runner.invoke(
        show_source, ["--auth-token", "flag-token"], env={"HEADRACE_AUTH_TOKEN_FILE": str(path)}
    )
    assert flag_over_file_env.output.splitlines()[1] == "fixed flag-token"
    file_over_token_env = runner.invoke(
        show_source, ["--auth-token-file", str(path)], env={"HEADRACE_AUTH_TOKEN": "env-token"}
    )
    assert file_over_token_env.output.splitlines()[1] == "rotated-token then rotated-token"
    both = runner.invoke(show_source, ["--auth-token", "t", "--auth-token-file", str(path)], env={})
    assert both.exit_code == 2 and "not both" in both.output
    both_env = runner.invoke(
        show_source, [], env={"HEADRACE_AUTH_TOKEN": "t", "HEADRACE_AUTH_TOKEN_FILE": str(path)}
    )
    assert both_env.exit_code == 2 and "not both" in both_env.output


def test_a_bad_token_file_stops_the_command_before_it_connects(tmp_path: Path) -> None:
    path = tmp_path / "client.token"
    path.write_text("# nothing yet\n")
    result = CliRunner().invoke(
        show_source, ["--auth-token-file", str(path)], env={"HEADRACE_AUTH_TOKEN": None}
    )
    assert result.exit_code == 2
    assert "--auth-token-file" in result.output and "holds no value" in result.output
    missing = CliRunner().invoke(show_source, ["--auth-token-file", str(tmp_path / "none")])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_tls_files_must_exist_and_cert_goes_with_key(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(show, ["--tls-ca", str(tmp_path / "no.pem")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    alone = runner.invoke(show, ["--tls-cert", str(cert)])
    assert alone.exit_code == 2 and "--tls-cert and --tls-key go together" in alone.output
    assert runner.invoke(show, ["--tls"]).output.endswith("tls=True\n")
    assert runner.invoke(show, []).output.endswith("tls=False\n")


def test_the_tls_context_verifies_the_broker() -> None:
    import ssl

    context = options.TlsFiles().context()
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname


@pytest.mark.parametrize(
    "command",
    [
        ["produce"],
        ["consume"],
        ["bench"],
        ["topics", "create"],
        ["topics", "list"],
        ["topics", "describe"],
        ["topics", "alter"],
        ["topics", "delete"],
        ["cohorts", "list"],
        ["cohorts", "describe"],
        ["cohorts", "seek"],
        ["cluster", "health"],
    ],
)
def test_every_client_command_takes_the_same_connection_options(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    for flag in (
        "--bootstrap",
        "--auth-token",
        "--auth-token-file",
        "--tls",
        "--tls-ca",
        "--tls-cert",
        "--tls-key",
    ):
        assert flag in result.output
    assert "HEADRACE_BOOTSTRAP" in result.output


def test_top_level_help_names_the_environment_variables() -> None:
    result = CliRunner().invoke(main, ["--help"])
    for variable in (
        "HEADRACE_BOOTSTRAP",
        "HEADRACE_CONTROLLER",
        "HEADRACE_AUTH_TOKEN",
        "HEADRACE_AUTH_TOKEN_FILE",
    ):
        assert variable in result.output


def test_a_controller_is_known_from_the_flag_the_environment_or_the_local_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HEADRACE_CONTROLLER", raising=False)

    def target(directory: Path, *, bootstrap_given: bool = False, dir_given: bool = False) -> Any:
        return ClientTarget("h:1", None, None, directory, bootstrap_given, dir_given)

    assert not options.controller_known(None, target(tmp_path))
    assert options.controller_known("http://c:1", target(tmp_path))
    _record(tmp_path, ["127.0.0.2"])
    assert options.controller_known(None, target(tmp_path))
    # An explicit --bootstrap names other brokers (a standalone one), unless --dir is given too.
    assert not options.controller_known(None, target(tmp_path, bootstrap_given=True))
    assert options.controller_known(None, target(tmp_path, bootstrap_given=True, dir_given=True))
    monkeypatch.setenv("HEADRACE_CONTROLLER", "http://c:1")
    assert options.controller_known(None, target(tmp_path / "elsewhere", bootstrap_given=True))


def test_a_server_name_verifies_one_name_whatever_is_dialled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--tls-server-name`` (and ``headrace drain``'s ``HEADRACE_TLS_SERVER_NAME``): the
    certificate must carry that name, whatever address the connection dials."""
    import ssl

    from headrace.cli import drain

    runner = CliRunner()
    out = runner.invoke(show, ["--tls-server-name", "demo.ns.svc"]).output
    assert out.endswith("tls=True\n")  # implies TLS
    context = options.TlsFiles(server_name="demo.ns.svc").context()
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    wrapped = context.wrap_bio(incoming, outgoing, server_hostname="127.3.0.7")
    assert wrapped.server_hostname == "demo.ns.svc"

    assert drain._tls_context("http://127.0.0.1:9644") is None
    monkeypatch.setenv(drain.SERVER_NAME_ENV, "demo.ns.svc")
    https = drain._tls_context("https://127.3.0.7:9644")
    assert https is not None
    assert https.wrap_bio(incoming, outgoing, server_hostname="x").server_hostname == "demo.ns.svc"
