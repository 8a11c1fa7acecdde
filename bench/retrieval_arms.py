"""The retrieval benchmark's arms (issue 21 §5): which ranking, profile and options a run uses,
and which CKF (fact recipe) it reads.

Every arm runs through the same `cdr.window.loop.Generator` with the extractive writer; an arm only
sets `GenerationConfig` fields and picks the CKF built with its recipe. Options the library
does not have yet (`subject`, `lexical`, the `focused` profile are being added while this
benchmark exists) are detected from `GenerationConfig`, `SessionOptions` and `PROFILES`: an arm
that needs one is listed as skipped with the reason, and lights up once the option lands.

- core arms: relevance only, spec CDR (`--profile spec`), `--profile fresh`, and the
  recommended profile (`focused`), each on both recipes (the recipe ablation);
- the ablation grid: on the recommended profile (`fresh` until `focused` exists), each of
  recipe (plain / title-section) × subject anchor (on / off) × lexical BM25 (on / off).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
from dataclasses import dataclass, field
from typing import Any

from cdr.errors import CdrError
from cdr.options import PROFILES, SessionOptions
from cdr.retrieval.fact_recipe import PLAIN, TITLE_SECTION, TITLE_SECTION_SHORT
from cdr.window.loop import GenerationConfig

RECIPES = (PLAIN, TITLE_SECTION, TITLE_SECTION_SHORT)
# The ablation grid varies the recipe between facts alone and facts with their context.
ABLATION_RECIPES = (PLAIN, TITLE_SECTION)
SHORT = {PLAIN: "plain", TITLE_SECTION: "ts", TITLE_SECTION_SHORT: "short"}
RECOMMENDED = "focused"
# Option values meaning "on" and "off" for the ablation (issue 21 §2, §3).
SUBJECT = {"on": "anchor", "off": "off"}
LEXICAL = {"on": "bm25", "off": "off"}


# The module that carries out each new option: an option the library accepts before its module
# has landed changes nothing yet, and an arm must not report it as measured.
OPTION_MODULES = {"subject": "cdr.retrieval.subject", "lexical": "cdr.retrieval.lexical",
                  "stale": "cdr.window.stale"}


@dataclass(frozen=True)
class RetrievalArm:
    name: str
    label: str
    recipe: str
    config: dict[str, Any] = field(default_factory=dict)  # GenerationConfig fields
    group: str = "core"  # "core" or "ablation"


def config_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(GenerationConfig)}


def option_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(SessionOptions)}


def implemented(option: str) -> bool:
    module = OPTION_MODULES.get(option)
    return module is None or importlib.util.find_spec(module) is not None


def inert(arm: RetrievalArm) -> list[str]:
    """Options the arm turns on (itself or through its profile) whose module is not in the
    library yet: accepted, but they change nothing."""
    opts = dataclasses.asdict(GenerationConfig(**arm.config).session_options())
    default = dataclasses.asdict(SessionOptions())
    return sorted(k for k, v in opts.items() if v != default[k] and not implemented(k))


def unavailable(arm: RetrievalArm) -> str | None:
    """Why `arm` cannot run on this checkout (None: it can)."""
    missing = sorted(set(arm.config) - config_fields())
    if missing:
        return f"GenerationConfig has no {', '.join(missing)} yet"
    profile = arm.config.get("profile")
    if profile is not None and profile not in PROFILES:
        return f"profile {profile!r} does not exist yet"
    try:
        GenerationConfig(**arm.config).session_options()
    except (CdrError, TypeError, ValueError) as e:
        return f"refused: {e}"
    off = [k for k in inert(arm) if k in arm.config]
    if off:
        return (f"{', '.join(off)} is accepted but {', '.join(OPTION_MODULES[k] for k in off)} "
                "is not in the library yet")
    return None


def resolved(arm: RetrievalArm) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """What the arm really runs: recipe, ranking and the session's options, an inert option
    counted as off (two arms that resolve the same are the same run)."""
    cfg = GenerationConfig(**arm.config)
    opts = dataclasses.asdict(cfg.session_options())
    default = dataclasses.asdict(SessionOptions())
    for k in inert(arm):
        opts[k] = default[k]
    return arm.recipe, cfg.ranking, tuple(sorted(opts.items()))


def base_profile() -> str:
    """The profile the ablation grid varies: the recommended one once it exists."""
    return RECOMMENDED if RECOMMENDED in PROFILES else "fresh"


def core_arms() -> list[RetrievalArm]:
    arms = []
    for recipe in RECIPES:
        s = SHORT[recipe]
        arms += [
            RetrievalArm(f"relevance {s}", f"relevance only, recipe {recipe}", recipe,
                         {"ranking": "relevance"}),
            RetrievalArm(f"spec {s}", f"CDR, --profile spec, recipe {recipe}", recipe,
                         {"ranking": "cdr", "profile": "spec"}),
            RetrievalArm(f"fresh {s}", f"CDR, --profile fresh, recipe {recipe}", recipe,
                         {"ranking": "cdr", "profile": "fresh"}),
            RetrievalArm(f"{RECOMMENDED} {s}", f"CDR, --profile {RECOMMENDED}, recipe {recipe}",
                         recipe, {"ranking": "cdr", "profile": RECOMMENDED}),
        ]
    return arms


def ablation_arms() -> list[RetrievalArm]:
    base = base_profile()
    arms = []
    for recipe, subj, lex in itertools.product(ABLATION_RECIPES, ("on", "off"), ("on", "off")):
        name = f"{base} {SHORT[recipe]} subject-{subj} bm25-{lex}"
        arms.append(RetrievalArm(
            name, f"CDR, --profile {base}, recipe {recipe}, subject={SUBJECT[subj]}, "
                  f"lexical={LEXICAL[lex]}", recipe,
            {"ranking": "cdr", "profile": base, "subject": SUBJECT[subj],
             "lexical": LEXICAL[lex]}, "ablation"))
    return arms


def all_arms() -> list[RetrievalArm]:
    return core_arms() + ablation_arms()


@dataclass
class ArmPlan:
    run: list[RetrievalArm]
    skipped: list[tuple[RetrievalArm, str]]  # (arm, why)


def plan_arms(arms: list[RetrievalArm]) -> ArmPlan:
    """The arms that can run here, without two that resolve to the same run; the others with
    why they are left out."""
    run: list[RetrievalArm] = []
    skipped: list[tuple[RetrievalArm, str]] = []
    seen: dict[Any, str] = {}
    for a in arms:
        why = unavailable(a)
        if why is None:
            key = resolved(a)
            if key in seen:
                why = f"runs exactly as {seen[key]!r}"
            else:
                seen[key] = a.name
        if why is None:
            run.append(a)
        else:
            skipped.append((a, why))
    return ArmPlan(run, skipped)


def generation_config(arm: RetrievalArm, *, max_windows: int, words: int) -> GenerationConfig:
    return GenerationConfig(max_windows=max_windows, words=words, **arm.config)
