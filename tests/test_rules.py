"""The registry of rules (`cdr.rules`): every rule declared once and read from there — the
session's options, the run's options and the profiles match it, and the shards rank a window
exactly when every rule's choice allows it."""

from __future__ import annotations

import importlib.util
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cdr.ckf import CKF
from cdr.options import (
    OPTION_CHOICES,
    OPTION_MEANINGS,
    PROFILE_NAMES,
    PROFILES,
    RunOptions,
    SessionOptions,
)
from cdr.rules import RULES, Rule, rule, shards_can_rank
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK

RULES_DIR = Path(__file__).resolve().parents[1] / "src" / "cdr" / "rules"


def test_each_rule_is_one_module_named_after_it() -> None:
    modules = sorted(p.stem for p in RULES_DIR.glob("*.py") if p.stem not in ("__init__", "rule"))
    assert modules == sorted(r.name for r in RULES)
    for r in RULES:
        assert importlib.util.find_spec(r.module) is not None, r.module  # where it is built
        assert r.why and r.meaning.split(":")[0].split(" / ")[0] in r.choices[1:]
        assert set(r.profiles) <= set(PROFILE_NAMES) - {"spec"}


def test_the_options_are_the_rules() -> None:
    names = [r.name for r in RULES]
    assert [f.name for f in fields(SessionOptions)] == names
    assert [n for n in (f.name for f in fields(RunOptions)) if n in OPTION_CHOICES] == names
    assert {r.name: r.choices for r in RULES} == OPTION_CHOICES
    assert {r.name: r.meaning for r in RULES} == OPTION_MEANINGS
    assert SessionOptions() == SessionOptions(**{r.name: r.spec for r in RULES})


def test_the_profiles_are_what_the_rules_declare() -> None:
    assert PROFILES["spec"] == SessionOptions()
    assert PROFILES["fresh"] == SessionOptions(memory="facts", envelope="fit", queries="expanded")
    assert PROFILES["focused"] == SessionOptions(
        memory="facts", lexical="bm25", stale="stop", length="contract", documents="support",
        plan="packed", pool="sections", citations="numbers")
    for name, options in PROFILES.items():
        for r in RULES:
            assert getattr(options, r.name) == r.profiles.get(name, r.spec)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"choices": ("only",)}, "two distinct"),
    ({"choices": ("a", "a")}, "two distinct"),
    ({"profiles": {"focused": "c"}}, "not among its own"),
    ({"ranked_on_shards": frozenset({"z"})}, "unknown choices"),
])
def test_a_malformed_rule_is_refused(kwargs: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"name": "x", "choices": ("a", "b"), "meaning": "b: does b.",
                            "module": "cdr.options"}
    with pytest.raises(ValueError, match=message):
        Rule(**{**base, **kwargs})


@pytest.fixture(scope="module")
def types_ckf(types_ckf_path: Path) -> CKF:
    return CKF.open(types_ckf_path)


class _ShardedCKF:
    """A CKF that also answers `rank_window` (the `RankingIndex` capability of a shard set):
    which way the loop packs a window is all this records."""

    def __init__(self, ckf: CKF) -> None:
        self._ckf = ckf

    def rank_window(self, w: Any) -> Any:
        raise AssertionError("recorded by the patched _pack_ranked_on_index instead")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ckf, name)


@pytest.mark.parametrize(("name", "choice"), [(r.name, c) for r in RULES for c in r.choices])
def test_the_shards_rank_a_window_exactly_when_every_rule_allows_it(
        types_ckf: CKF, monkeypatch: pytest.MonkeyPatch, name: str, choice: str) -> None:
    """One rule set to each of its choices, the others the spec's: the loop hands the window
    to the shards when, and only when, the rule declares that choice ranked on shards."""
    options = SessionOptions(**{name: choice})
    assert shards_can_rank(options) == (choice in rule(name).ranked_on_shards)
    gen = Generator(_ShardedCKF(types_ckf), get_writer("extractive"),
                    GenerationConfig(max_windows=2, **{name: choice}))  # type: ignore[arg-type]
    taken: list[str] = []
    here = gen._pack_ranked_here

    def on_index(session: Any, budget: Any, anchor: str, max_facts: Any,
                 costs_of: Any = None) -> Any:
        taken.append("shards")
        return here(session, budget, anchor, max_facts, None, costs_of)

    def on_here(*args: Any, **kw: Any) -> Any:
        taken.append("here")
        return here(*args, **kw)

    monkeypatch.setattr(gen, "_pack_ranked_on_index", on_index)
    monkeypatch.setattr(gen, "_pack_ranked_here", on_here)
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    prepared = gen.prepare(session)
    assert len(prepared.envelope) > 0 and taken
    want = "shards" if choice in rule(name).ranked_on_shards else "here"
    assert set(taken) == {want}, (name, choice, taken)
    assert np.all(np.isin(prepared.rows, np.arange(types_ckf.n_rows)))
