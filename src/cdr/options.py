"""The user's options for a run (`RunOptions`): each one's default and meaning, defined once.

`RunOptions` is what a user chooses about one run: the window limit, the words, the sub-queries,
the ranking mode, the token budgets and the opt-in rules below. The three faces derive from it:
`cdr generate`'s flags take their defaults and help from it, the gateway's request schema
(`cdr.gateway.schemas.GenerationOptions`) its descriptions and published defaults and its
wire names (`window_tokens` on the wire is `generation_tokens` here), and the library's
`GenerationConfig` (`cdr.window.config`) is a `RunOptions` plus the knobs and hooks no user
sets per run. `tests/test_run_options.py` checks that the CLI's, the schema's and the
config's defaults are these (docs/design.md §7.5 "Seams").

Opt-in session options beyond CRP-SPEC-024, and the presets that bundle them.

The spec's behaviour is the default and stays byte-for-byte what it was: a session with default
options serialises exactly as before (no option keys), and a session stored before the options
existed loads with the defaults. Each option is a rule of the registry `cdr.rules`, one module
each (`cdr.rules.memory`, `cdr.rules.pool`, ...): its choices, what its opt-in choice does,
where it is implemented, the profiles that turn it on and why, and whether the index's shards
can rank a window under it. This module builds the option table and the profiles from it.

A profile names a set of options: ``"spec"`` is the defaults, ``"fresh"`` turns on what the
quality benchmark measured to win on the Python-docs corpus, ``"focused"`` is fact memory plus
what the retrieval benchmark measured to keep a run on its task's own material in a knowledge
base of many similar documents: BM25 fusion, document support and the stale stop
(docs/retrieval.md, "Relevance means the task's own material"), and the length contract
(docs/length.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, get_args

from cdr.errors import InvalidInputError
from cdr.ranking import DEFAULT_MMR_LAMBDA, DEFAULT_RANKING, RANKING_MODES
from cdr.rules import RULES, rule

ProfileName = Literal["spec", "fresh", "focused"]
PROFILE_NAMES: tuple[str, ...] = get_args(ProfileName)

# Every option and its values, the first being the spec's: the CLI, the gateway schema and
# the trace schema are derived from this table, and the table from the rules.
OPTION_CHOICES: dict[str, tuple[str, ...]] = {r.name: r.choices for r in RULES}
# What each rule's opt-in choice does: the CLI's help and the API's description, after the
# spec's choice (`_session_option`).
OPTION_MEANINGS: dict[str, str] = {r.name: r.meaning for r in RULES}
OPTION_NAMES: tuple[str, ...] = tuple(OPTION_CHOICES)


@dataclass(frozen=True)
class SessionOptions:
    """The opt-in rules a session runs with; persisted in the session (`to_dict`). Each
    default is the spec's behaviour, the first of its choices in `OPTION_CHOICES`."""

    memory: str = rule("memory").spec
    envelope: str = rule("envelope").spec
    queries: str = rule("queries").spec
    repeats: str = rule("repeats").spec
    subject: str = rule("subject").spec
    lexical: str = rule("lexical").spec
    stale: str = rule("stale").spec
    length: str = rule("length").spec
    documents: str = rule("documents").spec
    plan: str = rule("plan").spec
    resume: str = rule("resume").spec
    pool: str = rule("pool").spec
    citations: str = rule("citations").spec

    def __post_init__(self) -> None:
        for name, choices in OPTION_CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise InvalidInputError(
                    f"unknown {name} option {value!r}; choose one of {choices}")

    @property
    def is_default(self) -> bool:
        return self == SessionOptions()

    def to_dict(self) -> dict[str, str]:
        """Only the options that differ from the spec's defaults (an empty dict for the spec),
        so default sessions and traces look exactly as they did before the options."""
        default = SessionOptions()
        return {k: v for k, v in asdict(self).items() if getattr(default, k) != v}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> SessionOptions:
        """Options from their stored form; None or {} (a session from before) = defaults."""
        if not data:
            return cls()
        if not isinstance(data, Mapping):
            raise InvalidInputError(f"session options must be an object, got {data!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidInputError(f"unknown session options {unknown}; known: {sorted(known)}")
        return cls(**{k: str(v) for k, v in data.items()})


# Each profile's choices are declared by the rules (`cdr.rules.*.RULE.profiles`, with why).
PROFILES: dict[str, SessionOptions] = {
    name: SessionOptions(**{r.name: r.profiles[name] for r in RULES if name in r.profiles})
    for name in PROFILE_NAMES
}


# The profile `cdr generate` and the gateway start a run with when the user names none: the
# rule set before the runs was met at loop version 5 (docs/retrieval.md, "The default:
# `focused`"). The library's default stays the spec (`RunOptions.profile` None, so
# `GenerationConfig`, `cdr.spec`, the oracle and the conformance tests run the spec loop);
# `--profile spec` / `"profile": "spec"` gives the spec run on the faces.
FACES_PROFILE: ProfileName = "focused"


def resolve_options(profile: str | None = None, **options: str | None) -> SessionOptions:
    """A profile's options with any explicitly given option on top (None = not given)."""
    if profile is not None and profile not in PROFILES:
        raise InvalidInputError(f"unknown profile {profile!r}; choose one of {PROFILE_NAMES}")
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise InvalidInputError(f"unknown session options {unknown}; known: {list(OPTION_NAMES)}")
    base = asdict(PROFILES[profile or "spec"])
    base.update({k: v for k, v in options.items() if v is not None})
    return SessionOptions(**base)


# ---------------------------------------------------------------------------- the run's options

# Windows a run may ask for (CRP-SPEC-024 §6, Exit 2's limit): the CLI refuses more, the
# gateway's schema bounds `max_windows` by it (and its operator's cap may be lower).
MAX_WINDOWS_LIMIT = 20


@dataclass(frozen=True)
class Spelling:
    """How one user option is spelt on each face: `meaning` is the CLI's help and the API's
    description; `flag` the `cdr generate` option (None: not a flag); `wire` the HTTP request
    field (None: not accepted per request, e.g. a server setting)."""

    meaning: str
    flag: str | None
    wire: str | None


def _option(default: Any, meaning: str, *, flag: str | None, wire: str | None) -> Any:
    return field(default=default, metadata={"spelling": Spelling(meaning, flag, wire)})


def _session_option(name: str) -> Any:
    """An opt-in rule of the session (`OPTION_NAMES`): None (the profile's) by default, its
    meaning the spec's choice then the opt-in's (`OPTION_MEANINGS`), and spelt with its own
    name on every face (`--NAME`, the request field NAME), so that a rule has one name
    wherever it is set."""
    meaning = f"{OPTION_CHOICES[name][0]} (spec) | {OPTION_MEANINGS[name]}"
    return _option(None, meaning, flag=f"--{name}", wire=name)


@dataclass
class RunOptions:
    """What a user chooses about one run, each with its default and meaning (see the module
    doc). The opt-in rules are None for "the profile's", so a profile and single options on
    top of it resolve to the session's `SessionOptions` (`session_options`)."""

    max_windows: int = _option(
        5, f"Maximum number of windows (1–{MAX_WINDOWS_LIMIT}): the run ends after this many "
        "(Exit 2).", flag="--windows", wire="max_windows")
    words: int = _option(1800, "Target length of the whole document, in words.",
                         flag="--words", wire="words")
    sub_queries: int = _option(6, "Sub-queries for automatic decomposition (when no outline "
                               "is given).", flag="--sub-queries", wire="sub_queries")
    ranking: str = _option(DEFAULT_RANKING, f"Phase 2 ranking mode: {' | '.join(RANKING_MODES)}.",
                           flag="--ranking", wire="ranking")
    min_relevance: float | None = _option(
        None, "Relevance gate; default: calibrated for the CKF's embedding model (the gateway "
        "takes it from CDR_MIN_RELEVANCE).", flag="--min-relevance", wire=None)
    mmr_lambda: float = _option(DEFAULT_MMR_LAMBDA, "λ of --ranking mmr: relevance against "
                                "redundancy.", flag="--mmr-lambda", wire=None)
    generation_tokens: int = _option(
        1024, "Generation reserve G: the most tokens one window may write (the LLM's "
        "max_tokens per window).", flag="--generation-tokens", wire="window_tokens")
    context_tokens: int = _option(
        4096, "Context size C of the LLM that writes the windows; the envelope gets C minus "
        "G and the rest of the prompt (system prompt, task, anchor, plan, instructions, fact "
        "labels).", flag="--context-tokens",
        wire="context_tokens")
    # Opt-in rules beyond the spec, fixed into the session at its start and persisted with it.
    profile: str | None = _option(
        None, "Preset of options beyond the spec: spec | fresh (fact memory, fitted "
        "envelopes, expanded sub-queries) | focused (fact memory, BM25 fused relevance, "
        "document support, a stop on stale envelopes, the length contract, plans by the packed "
        "facts, candidates by section, numbered citations). Single options override it. "
        f"`cdr generate` and the gateway default to {FACES_PROFILE}; the library "
        "(GenerationConfig) to spec.",
        flag="--profile",
        wire="profile")
    memory: str | None = _session_option("memory")
    envelope: str | None = _session_option("envelope")
    queries: str | None = _session_option("queries")
    repeats: str | None = _session_option("repeats")
    subject: str | None = _session_option("subject")
    lexical: str | None = _session_option("lexical")
    stale: str | None = _session_option("stale")
    length: str | None = _session_option("length")
    documents: str | None = _session_option("documents")
    plan: str | None = _session_option("plan")
    resume: str | None = _session_option("resume")
    pool: str | None = _session_option("pool")
    citations: str | None = _session_option("citations")

    def session_options(self) -> SessionOptions:
        """The profile's options with single ones on top; an unknown value is refused."""
        return resolve_options(self.profile, **{n: getattr(self, n) for n in OPTION_NAMES})

    def run_options(self) -> RunOptions:
        """Just the user's options (a `GenerationConfig` drops its knobs and hooks)."""
        return RunOptions(**{f.name: getattr(self, f.name) for f in fields(RunOptions)})


# Every default, read as attributes: `DEFAULTS.words` is the one 1800.
DEFAULTS = RunOptions()
# The defaults of the two faces (`cdr generate`'s flags, the gateway's request schema and the
# options it stores with a session): the library's, with the faces' profile.
FACE_DEFAULTS = RunOptions(profile=FACES_PROFILE)
RUN_OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(RunOptions))


def spelling(name: str) -> Spelling:
    """How the option `name` (a `RunOptions` field) is spelt on the CLI and the wire."""
    for f in fields(RunOptions):
        if f.name == name:
            return f.metadata["spelling"]  # type: ignore[no-any-return]
    raise InvalidInputError(f"unknown run option {name!r}; known: {list(RUN_OPTION_NAMES)}")


def meaning(name: str) -> str:
    """The option's one description (CLI help, API description)."""
    return spelling(name).meaning


def wire_names() -> dict[str, str]:
    """{HTTP request field: `RunOptions` field} for the options a request may set."""
    return {sp.wire: f.name for f in fields(RunOptions)
            if (sp := f.metadata["spelling"]).wire is not None}
