"""`CDR_CKF=ray://…` is read exactly like `--ckf ray://…` by `cdr serve` and `cdr generate`:
one parser (`cdr.cluster.ray_index.parse_address`), a malformed address is one line naming what is
wrong with exit status 2, and nothing after `ray://` that could be a credential is echoed.
The gateway's settings (what `uvicorn --factory cdr.gateway.app:create_app` reads) resolve
the same address to the shard set's directory and keep the address to open it by."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cdr.cli import app as main_app
from cdr.cluster.ray_index import parse_address
from cdr.errors import InvalidInputError
from cdr.gateway.settings import GatewayConfigError, load_settings

runner = CliRunner()
SECRET = "hunter2-s3cret"

# (address, what the one-line error must name)
MALFORMED = [
    ("ray://127.0.0.1/kb", "no port"),
    ("ray://127.0.0.1:99999/kb", "port must be"),
    ("ray://127.0.0.1:six/kb", "port must be"),
    ("ray://:6379/kb", "no host"),
    ("ray://1.2.3.4:6379", "no shard-set path"),
    ("ray://1.2.3.4:6379/", "no shard-set path"),
    (f"ray://admin:{SECRET}@10.0.0.1:6379/kb", "user or password"),
    (f"ray://10.0.0.1:6379/kb?token={SECRET}", "query or fragment"),
    ("ray://10.0.0.1:6379/kb/../../etc", "'..'"),
]


@pytest.mark.parametrize(("address", "problem"), MALFORMED)
def test_the_parser_names_the_problem_and_echoes_no_secret(address: str, problem: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        parse_address(address)
    msg = str(info.value)
    assert problem in msg and "ray://HOST:PORT/ABS_PATH" in msg
    assert SECRET not in msg and "\n" not in msg


def one_line_error(result) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("command", [["generate", "a task"], ["serve"]])
@pytest.mark.parametrize(("address", "problem"), MALFORMED)
def test_cdr_ckf_and_dash_dash_ckf_fail_alike_with_exit_2(
        command: list[str], address: str, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CDR_DEV", "1")
    by_option = runner.invoke(main_app, [*command, "--ckf", address], env={"CDR_CKF": ""})
    by_env = runner.invoke(main_app, command, env={"CDR_CKF": address})
    for result in (by_option, by_env):
        assert result.exit_code == 2, result.output
        line = one_line_error(result)
        assert problem in line and SECRET not in result.output
    assert one_line_error(by_option) == one_line_error(by_env)


def test_gateway_settings_resolve_a_ray_address_to_its_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CDR_CKF", "ray://127.0.0.1:6379/srv/kb.shards")
    s = load_settings()
    assert s.ckf == Path("/srv/kb.shards")
    assert s.ray_address == "ray://127.0.0.1:6379/srv/kb.shards"
    assert s.session_db == Path("/srv/kb.shards/sessions.sqlite3")
    # An override given as the address (what `cdr serve --ckf` passes) reads the same.
    assert load_settings(ckf="ray://127.0.0.1:6379/srv/kb.shards").ray_address == s.ray_address
    monkeypatch.setenv("CDR_CKF", str(tmp_path / "local"))
    local = load_settings()
    assert local.ckf == tmp_path / "local" and local.ray_address is None


def test_gateway_settings_refuse_a_malformed_address_in_one_line_without_the_secret(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CDR_CKF", f"ray://admin:{SECRET}@10.0.0.1:6379/kb")
    with pytest.raises(GatewayConfigError) as info:
        load_settings()
    msg = str(info.value)
    assert msg.startswith("CDR_CKF") and "user or password" in msg
    assert SECRET not in msg and "\n" not in msg
