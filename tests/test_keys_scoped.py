"""API keys scoped to knowledge bases: `scope@kb1+kb2:key`, `scope@*:key`, and the old
`scope:key` (all KBs); `cdr keygen --kb NAME`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdr.gateway.auth import (
    SCOPES,
    KeyConfigError,
    format_key_entry,
    hash_key,
    parse_api_keys,
)
from tests.gateway_server import child_env, cli_in_process

KEY = "cdr_scoped_Hq7vR2mX9pL4wT6yK1nB8cJ3dF5gS0eZ"
HASH = hash_key(KEY)
KEY2 = "cdr_scoped_Wm3xQ8rT1vY6uN9oP2kL5hG7fD4sA0cV"
KEY3 = "cdr_scoped_Jp5tY2wQ9mR7uK1oL4nH8gF3dS6aZ0xB"
KB_NAME = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)


def test_old_entries_reach_every_kb() -> None:
    (key,) = parse_api_keys(f"generate:{HASH}")
    assert key.kbs is None
    assert key.reaches("default") and key.reaches("anything")


def test_named_and_star_entries() -> None:
    one, star, plain = parse_api_keys(f"generate@docs+hr:{HASH}, admin@*:{KEY2},"
                                      f"generate@wiki:{KEY3}")
    assert one.scope == "generate" and one.kbs == frozenset({"docs", "hr"})
    assert one.reaches("docs") and one.reaches("hr") and not one.reaches("wiki")
    assert star.scope == "admin" and star.kbs is None and star.reaches("wiki")
    assert plain.kbs == frozenset({"wiki"}) and not plain.reaches("default")


@given(st.sampled_from(SCOPES), st.one_of(st.none(), st.frozensets(KB_NAME, min_size=1,
                                                                     max_size=4)))
def test_entries_round_trip(scope: str, kbs: frozenset[str] | None) -> None:
    entry = format_key_entry(scope, HASH, kbs)
    (key,) = parse_api_keys(entry)
    assert (key.scope, key.kbs, key.digest.hex()) == (scope, kbs, HASH.removeprefix("sha256:"))
    if kbs is None:
        assert entry == f"{scope}:{HASH}"  # the old format, read by older gateways too


@pytest.mark.parametrize(("entry", "words"), [
    (f"generate@:{HASH}", "knowledge base"),
    (f"generate@docs+:{HASH}", "knowledge base"),
    (f"generate@*+docs:{HASH}", "'*' alone"),
    (f"generate@bad/name:{HASH}", "'bad/name'"),
    (f"generate@{'x' * 65}:{HASH}", "knowledge base"),
    (f"reader@docs:{HASH}", "scope one of generate, admin"),
])
def test_bad_entries_name_the_problem(entry: str, words: str) -> None:
    with pytest.raises(KeyConfigError) as exc:
        parse_api_keys(f"admin:{KEY2},{entry}")
    message = str(exc.value)
    assert "entry 2" in message and words in message and "\n" not in message


def test_two_entries_for_one_key_are_refused() -> None:
    with pytest.raises(KeyConfigError, match="entries 1 and 2 are the same key"):
        parse_api_keys(f"generate@docs:{HASH},admin@hr:{KEY}")


def _keygen(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cdr.cli", "keygen", *args],
                          env=child_env({}), cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)


def test_keygen_kb_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = _keygen(tmp_path, "--kb", "docs", "--kb", "hr", "--kb", "docs")
    assert proc.returncode == 0, proc.stderr
    out = dict(line.split("=", 1) for line in proc.stdout.strip().splitlines())
    assert out["CDR_API_KEYS"] == f"generate@docs+hr:{hash_key(out['key'])}"
    (key,) = parse_api_keys(out["CDR_API_KEYS"])
    assert key.kbs == frozenset({"docs", "hr"})
    # The same command in this process (`cli_in_process`, no second start-up).
    status, stdout, _ = cli_in_process(tmp_path, ["keygen", "--scope", "admin", "--kb", "*"],
                                       {}, monkeypatch)
    assert status == 0 and "CDR_API_KEYS=admin@*:sha256:" in stdout


@pytest.mark.parametrize("args", [["--kb", "no/slash"], ["--kb", "*", "--kb", "docs"],
                                  ["--kb", ""]])
def test_keygen_refuses_bad_kb_names(tmp_path: Path, args: list[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The first case in a real `cdr keygen` process, the others in this one
    (`cli_in_process`: the same exit, stdout and stderr, without a process start-up)."""
    if args == ["--kb", "no/slash"]:
        proc = _keygen(tmp_path, *args)
        status, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    else:
        status, stdout, stderr = cli_in_process(tmp_path, ["keygen", *args], {}, monkeypatch)
    assert status == 2 and stdout == ""
    assert len(stderr.strip().splitlines()) == 1 and "--kb" in stderr
