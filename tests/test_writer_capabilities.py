"""Writer capabilities instead of writer names: the loop and the gateway ask a writer what it
does (`pastes_facts`), and the CLI and settings ask the writer's class whether it needs an
upstream model (`needs_model`); the names live in the registry and the writer classes only."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

import cdr
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import (
    DEFAULT_WRITER,
    WRITER_NAMES,
    WriterName,
    build_writer,
    get_writer,
    needs_model,
    pastes_facts,
)
from cdr.writers.base import WriterResult


def test_the_registry_says_which_writers_need_a_model():
    assert {n: needs_model(n) for n in WRITER_NAMES} == {
        "extractive": False, "openai": True, "anthropic": True, "local": False}
    assert needs_model("some-future-api")  # unknown: ask for a model rather than guess


def test_each_capability_is_a_flag_of_the_writer_class():
    from cdr.writers.anthropic_writer import AnthropicWriter
    from cdr.writers.extractive import ExtractiveWriter
    from cdr.writers.local import LocalWriter
    from cdr.writers.openai_writer import OpenAIWriter

    flags = {cls.name: (cls.pastes_facts, cls.needs_model)
             for cls in (ExtractiveWriter, OpenAIWriter, AnthropicWriter, LocalWriter)}
    assert flags == {"extractive": (True, False), "openai": (False, True),
                     "anthropic": (False, True), "local": (False, False)}
    # A writer object answers for itself; one from before the flags is a prose writer that
    # needs a model.
    assert not needs_model(ExtractiveWriter()) and needs_model(object())


def test_the_names_are_the_registry_s_and_the_default_is_one_of_them():
    from cdr.gateway.settings import GatewaySettings

    assert get_args(WriterName) == WRITER_NAMES
    assert DEFAULT_WRITER in WRITER_NAMES and not needs_model(DEFAULT_WRITER)
    field = GatewaySettings.model_fields["writer"]
    assert get_args(field.annotation) == WRITER_NAMES and field.default == DEFAULT_WRITER


def test_a_base_url_comes_from_the_writer_class_not_its_name():
    import cdr.writers

    assert build_writer("openai", model="m").url.startswith("https://api.openai.com/v1")
    assert cdr.writers.OpenAIWriter.default_base_url == "https://api.openai.com/v1"
    assert build_writer("openai", model="m", base_url="http://127.0.0.1:9/v1").url.startswith(
        "http://127.0.0.1:9/v1")


SRC = Path(cdr.__file__).parent
# Where the names belong: the registry and the writer classes.
WRITERS_PACKAGE = SRC / "writers"


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def writer_name_uses(root: Path) -> list[str]:
    """Every string constant equal to a writer name, and every comparison of a writer's
    `.name`, in `root` outside the writers package (docstrings and the OpenAPI tag of the
    OpenAI-compatible routes, `tags=["openai"]`, are not writer names)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if WRITERS_PACKAGE in path.parents:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "tags":
                skip.update(id(n) for n in ast.walk(node.value))
        where = path.relative_to(root.parent)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and node.value in WRITER_NAMES
                    and id(node) not in skip):
                found.append(f"{where}:{node.lineno} {node.value!r}")
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    if (isinstance(side, ast.Attribute) and side.attr == "name"
                            and "writer" in ast.unparse(side.value).lower()):
                        found.append(f"{where}:{node.lineno} {ast.unparse(node)}")
    return found


def test_writer_names_appear_in_src_only_in_the_registry_and_the_writer_classes():
    assert writer_name_uses(SRC) == []


def test_the_name_scan_finds_what_it_looks_for(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        '"""extractive"""\n'
        'def f(writer):\n'
        '    """local"""\n'
        '    if writer.name != "extractive":\n'
        '        return "local"\n'
        '    return dict(tags=["openai"])\n', encoding="utf-8")
    assert sorted(writer_name_uses(pkg)) == [
        "pkg/m.py:4 'extractive'", "pkg/m.py:4 writer.name != 'extractive'",
        "pkg/m.py:5 'local'"]


def test_pasting_is_a_property_of_the_writer_not_its_name():
    assert pastes_facts(get_writer("extractive"))
    assert not pastes_facts(get_writer("openai", model="m", base_url="http://127.0.0.1:9"))

    class Renamed:  # a fact-pasting writer under another name
        name = "my-paster"
        pastes_facts = True

    assert pastes_facts(Renamed()) and not pastes_facts(object())


class Recorder:
    """A prose writer that records what it was asked; `pastes_facts` set per instance."""

    name = "recorder"

    def __init__(self, pastes: bool) -> None:
        self.pastes_facts = pastes
        self.calls: list[list[dict[str, str]]] = []

    def generate(self, messages, max_tokens, *, on_delta=None) -> WriterResult:
        self.calls.append(messages)
        return WriterResult("Background\nUsage\n", "stop", {})


@pytest.mark.parametrize("pastes", [True, False])
def test_only_a_prose_writer_is_asked_for_the_outline(tiny_ckf_path, pastes):
    from cdr.ckf import CKF

    writer = Recorder(pastes)
    with CKF.open(tiny_ckf_path) as ckf:
        gen = Generator(ckf, writer, GenerationConfig(max_windows=1, words=400))
        sqs = gen.decompose("Write a guide to the pass statement")
    assert (len(writer.calls) == 0) == pastes
    if not pastes:
        assert [sq.text for sq in sqs] == ["Background", "Usage"]
