"""The documentation pages that restate code stay equal to it: the generated CLI and HTTP
references, the settings table, and the spec's copy (unchanged, with its attribution)."""

from __future__ import annotations

import hashlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# sha256 of CRP-SPEC-024 v3.1.0 as published (the text between the page's fences).
SPEC_SHA256 = "d572d4d6610d807cf98b8d2e3481fdd13e513dee2b7917000a0a04533188c861"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_reference_pages_are_current():
    """`python docs/gen_reference.py` rewrites these; a changed command, option or route
    without a regenerated page fails here."""
    for path, text in _generator().render().items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(ROOT)} is stale: run python docs/gen_reference.py")


def test_cli_reference_covers_every_command():
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    for command in ("ingest", "generate", "serve", "report", "keygen", "ckf stats",
                    "ckf reembed", "models install"):
        assert f"## `cdr {command}`" in page
    assert "[env var: CDR_CKF" in page


def test_settings_module_lists_every_variable_the_code_reads():
    from cdr.settings import SETTINGS

    names = set()
    for path in [*(ROOT / "src").rglob("*.py"), *(ROOT / "bench").rglob("*.py"),
                 *(ROOT / "tests").rglob("*.py")]:
        names |= set(re.findall(r"\bCDR_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text("utf-8")))
    listed = [s.name for s in SETTINGS]
    assert len(listed) == len(set(listed)), "a variable listed twice"
    assert sorted(names - set(listed)) == []


def test_settings_module_matches_gateway_settings():
    """Every gateway setting has its entry, in the gateway group, with the code's default."""
    from cdr.gateway.settings import GatewaySettings
    from cdr.settings import GROUPS, setting

    for field, info in GatewaySettings.model_fields.items():
        entry = setting(f"CDR_{field.upper()}")
        assert entry.group == "gateway" and entry.group in GROUPS, entry.name
        if info.default is None:
            assert entry.default.startswith("none"), entry
        elif isinstance(info.default, bool):
            assert entry.default == f"`{str(info.default).lower()}`", entry
        else:
            assert entry.default == f"`{info.default}`", entry
    with pytest.raises(KeyError, match=r"add it to cdr\.settings"):
        setting("CDR_" + "UNDOCUMENTED")  # spelt apart, or the scan above would find it


def test_settings_module_lists_the_writer_registry_s_names():
    """`CDR_WRITER`'s documented choices are the registry's names, in its order (the settings
    module is below the writers in the layers, so it cannot import them: this keeps it equal)."""
    from cdr.settings import setting
    from cdr.writers import WRITER_NAMES

    assert setting("CDR_WRITER").type == ", ".join(f"`{n}`" for n in WRITER_NAMES)


def test_settings_page_rows_are_the_modules_entries():
    from cdr.settings import GROUPS, SETTINGS

    page = (DOCS / "reference" / "settings.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(CDR_[A-Z0-9_]+)` \|", page, re.M)
    assert rows == [s.name for g in GROUPS for s in SETTINGS if s.group == g]
    assert {s.group for s in SETTINGS} <= set(GROUPS)


def test_spec_copy_is_unchanged_and_attributed():
    page = (DOCS / "spec" / "CRP-SPEC-024.md").read_text(encoding="utf-8")
    body = re.search(r"^~~~~text\n(.*)\n~~~~$", page, re.S | re.M).group(1)
    assert hashlib.sha256(body.encode("utf-8")).hexdigest() == SPEC_SHA256
    note = page[: page.index("~~~~text")]
    for part in ("CRP-SPEC-024", "Constantinos Vidiniotis, AutoCyber AI Pty Ltd",
                 "CC BY 4.0", "https://creativecommons.org/licenses/by/4.0/", "unchanged"):
        assert part in note


def test_api_reference_documents_the_public_modules_and_the_seams():
    """Each public import path and each seam (docs/design.md §7.5) has its mkdocstrings
    block, and every block names a module that imports."""
    page = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^::: ([\w.]+)$", page, re.M)
    assert {"cdr", "cdr.spec", "cdr.ranking", "cdr.session", "cdr.options", "cdr.window.config",
            "cdr.writers.base", "cdr.gateway.knowledge_base", "cdr.ckf.kinds"} <= set(blocks)
    assert [b for b in blocks if importlib.util.find_spec(b) is None] == []
