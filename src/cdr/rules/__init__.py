"""The opt-in rules beyond CRP-SPEC-024, one module each: what a rule is called, its choices
(the spec's first), what its opt-in choice does, where it is implemented, which profiles turn
it on and why, and whether the index's shards can still rank a window under it.

Everything else reads the rules from here: `cdr.options` builds the session's option table,
the profiles and their checks from `RULES`; the CLI's flags, the gateway's request fields and
the trace schema's enums come from that table; the window loop asks `shards_can_rank` before
it lets the shards rank a window. A new rule is a new module here, listed in `_MODULES`, and
its seam in the loop: the option's field on `SessionOptions` and `RunOptions` is checked
against this registry (`tests/test_rules.py`).
"""

from __future__ import annotations

import importlib

from cdr.rules.rule import Rule

__all__ = ["RULES", "Rule", "rule", "shards_can_rank"]


# The rules, in the order the faces list them (CLI flags, request fields, trace enums).
_MODULES = ("memory", "envelope", "queries", "repeats", "subject", "lexical", "stale",
            "length", "documents", "plan", "resume", "pool", "citations")

RULES: tuple[Rule, ...] = tuple(
    importlib.import_module(f"{__name__}.{name}").RULE for name in _MODULES)
_BY_NAME: dict[str, Rule] = {r.name: r for r in RULES}


def rule(name: str) -> Rule:
    """The rule called `name` (KeyError for none)."""
    return _BY_NAME[name]


def shards_can_rank(options: object) -> bool:
    """Whether every rule's choice in `options` (anything with the rules as attributes, such
    as `cdr.options.SessionOptions`) lets the index's shards rank a window themselves."""
    return all(getattr(options, r.name) in r.ranked_on_shards for r in RULES)
