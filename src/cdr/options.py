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
existed loads with the defaults. Each option is a rule in its own module:

- `memory`: ``"off"`` (spec: novelty is per topic) or ``"facts"`` (`cdr.fact_memory`: facts
  already shown, and more strongly facts already written, lose score in later windows);
- `envelope`: ``"budget"`` (spec: fill the envelope budget E) or ``"fit"`` (`cdr.window.fit`: pack
  about as many facts as the window's planned words can use);
- `queries`: ``"titles"`` (spec: sub-queries are embedded as written) or ``"expanded"``
  (`cdr.retrieval.expansion`: each sub-query is expanded once at session start from the CKF, and the
  expansion drives residual pull, the plan and Stage 8 attribution);
- `repeats`: ``"keep"`` (spec: the window's text is kept as written) or ``"drop"``
  (`cdr.window.repeat_guard`: sentences, list items and code an earlier window already wrote, in the
  same words or, for prose, the same meaning, are taken out before Stage 8);
- `subject`: ``"off"`` (spec: an outline line is embedded as written) or ``"anchor"``
  (`cdr.retrieval.subject`: each sub-query is embedded as the task's subject plus its line, so
  "Background" means the background *of this task's subject*; the window still writes under
  "Background");
- `lexical`: ``"off"`` (spec: relevance is the cosine) or ``"bm25"`` (`cdr.retrieval.lexical`:
  relevance fuses the cosine with a BM25 score of the task's words, so facts that name the subject's
  own terms pass the gate);
- `stale`: ``"write"`` (spec: a window is written whatever its envelope holds, until an exit
  fires) or ``"stop"`` (`cdr.window.stale`: a window whose envelope is mostly facts earlier windows
  were already sent ends the run with `ckf-exhausted`, unwritten);
- `length`: ``"open"`` (spec: the words asked only size the sub-queries; a run ends on the
  spec's four exits) or ``"contract"`` (`cdr.window.length`: each window is planned for the words
  still owed, as many as its generation budget carries at the writer's words per token; a section
  written whole is not planned again, only one cut off is continued; and the run ends with
  `task-complete` once the words delivered reach the ±15% band of the words asked);
- `documents`: ``"off"`` (spec: each fact's relevance is its own) or ``"support"``
  (`cdr.retrieval.doc_support`: a fact's relevance is weighed by how well its document's best fact
  matches the task, against the best-matching document's);
- `plan`: ``"outline"`` (spec: a model writer's window plans the leading open sections its
  words cover, in outline order, and the packed facts are assigned among them) or ``"packed"``
  (`cdr.window.plan`: it plans only open sections that own at least a few of its packed facts,
  each fact owned by its closest open section, so a window is never asked for a section its
  envelope holds nothing of);
- `resume`: ``"prompt"`` (spec: a window that continues a section an earlier window began is
  told so in its prompt) or ``"prefill"`` (`cdr.window.resume`: with a writer that can continue
  a begun answer, the local model, that window's answer starts with the section's heading and
  the last words written for it, and the model goes on from them);
- `pool`: ``"task"`` (spec: Phase 1 gates each fact by its relevance to the task query) or
  ``"sections"`` (the window loop's `_section_pool`: a fact is a candidate when it is relevant
  to the task or to one of its outline sections, each section pulled toward the task, at its
  best relevance; BM25 words and document support are each query's own; navigation pages
  such as a back-of-book index are left out, `cdr.retrieval.navigation`), so a task whose
  sections live in different documents reaches every one of them.

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

MemoryMode = Literal["off", "facts"]
EnvelopeMode = Literal["budget", "fit"]
QueriesMode = Literal["titles", "expanded"]
RepeatsMode = Literal["keep", "drop"]
SubjectMode = Literal["off", "anchor"]
LexicalMode = Literal["off", "bm25"]
StaleMode = Literal["write", "stop"]
LengthMode = Literal["open", "contract"]
DocumentsMode = Literal["off", "support"]
PlanMode = Literal["outline", "packed"]
ResumeMode = Literal["prompt", "prefill"]
PoolMode = Literal["task", "sections"]
CitationsMode = Literal["off", "numbers", "footnotes"]
ProfileName = Literal["spec", "fresh", "focused"]

MEMORY_MODES: tuple[str, ...] = get_args(MemoryMode)
ENVELOPE_MODES: tuple[str, ...] = get_args(EnvelopeMode)
QUERIES_MODES: tuple[str, ...] = get_args(QueriesMode)
REPEATS_MODES: tuple[str, ...] = get_args(RepeatsMode)
SUBJECT_MODES: tuple[str, ...] = get_args(SubjectMode)
LEXICAL_MODES: tuple[str, ...] = get_args(LexicalMode)
STALE_MODES: tuple[str, ...] = get_args(StaleMode)
LENGTH_MODES: tuple[str, ...] = get_args(LengthMode)
DOCUMENTS_MODES: tuple[str, ...] = get_args(DocumentsMode)
PLAN_MODES: tuple[str, ...] = get_args(PlanMode)
RESUME_MODES: tuple[str, ...] = get_args(ResumeMode)
POOL_MODES: tuple[str, ...] = get_args(PoolMode)
CITATIONS_MODES: tuple[str, ...] = get_args(CitationsMode)
PROFILE_NAMES: tuple[str, ...] = get_args(ProfileName)

# Every option and its values, the first being the spec's: the CLI, the gateway schema and
# the trace schema are derived from this table.
OPTION_CHOICES: dict[str, tuple[str, ...]] = {
    "memory": MEMORY_MODES, "envelope": ENVELOPE_MODES, "queries": QUERIES_MODES,
    "repeats": REPEATS_MODES, "subject": SUBJECT_MODES, "lexical": LEXICAL_MODES,
    "stale": STALE_MODES, "length": LENGTH_MODES, "documents": DOCUMENTS_MODES,
    "plan": PLAN_MODES, "resume": RESUME_MODES, "pool": POOL_MODES,
    "citations": CITATIONS_MODES,
}
# What each rule's opt-in choice does: the CLI's help and the API's description, after the
# spec's choice (`_session_option`).
OPTION_MEANINGS: dict[str, str] = {
    "memory": "facts: facts already shown or written lose score in later windows.",
    "envelope": "fit: pack as many facts as the window's planned words can use.",
    "queries": "expanded: sub-queries expanded from the CKF at session start.",
    "repeats": "drop: take out of each window the sentences, list items and code an "
        "earlier window already wrote (same words or same meaning).",
    "subject": "anchor: embed each sub-query as the task's subject plus its line.",
    "lexical": "bm25: relevance fuses the cosine with BM25 over the task's words.",
    "stale": "stop: end the run (ckf-exhausted) instead of writing a window whose "
        "envelope is mostly facts already sent.",
    "length": "contract: plan each window for the words still owed, write a section "
        "once (continue only one cut off), end task-complete once the words asked are "
        "delivered within ±15%.",
    "documents": "support: weigh each fact's relevance by how well its document matches "
        "the task against the best-matching document.",
    "plan": "packed: a model writer's window plans only the open sections that own "
        "enough of its packed facts (never a section its envelope holds nothing of).",
    "resume": "prefill: a writer that can (the local model) starts a window that continues "
        "a begun section with its heading and last written words, and goes on from them.",
    "pool": "sections: a fact is a candidate when it is relevant to the task or to one of "
        "its sections (each pulled toward the task), so a task spanning documents reaches "
        "each.",
    "citations": "numbers / footnotes: each sentence cites the facts it rests on, [n] or "
        "[^n], checked and repaired against the window's facts; the document ends with its "
        "sources.",
}
OPTION_NAMES: tuple[str, ...] = tuple(OPTION_CHOICES)
_CHOICES = OPTION_CHOICES


@dataclass(frozen=True)
class SessionOptions:
    """The opt-in rules a session runs with; persisted in the session (`to_dict`). Each
    default is the spec's behaviour, the first of its choices in `OPTION_CHOICES`."""

    memory: str = MEMORY_MODES[0]
    envelope: str = ENVELOPE_MODES[0]
    queries: str = QUERIES_MODES[0]
    repeats: str = REPEATS_MODES[0]
    subject: str = SUBJECT_MODES[0]
    lexical: str = LEXICAL_MODES[0]
    stale: str = STALE_MODES[0]
    length: str = LENGTH_MODES[0]
    documents: str = DOCUMENTS_MODES[0]
    plan: str = PLAN_MODES[0]
    resume: str = RESUME_MODES[0]
    pool: str = POOL_MODES[0]
    citations: str = CITATIONS_MODES[0]

    def __post_init__(self) -> None:
        for name, choices in _CHOICES.items():
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


PROFILES: dict[str, SessionOptions] = {
    "spec": SessionOptions(),
    "fresh": SessionOptions(memory="facts", envelope="fit", queries="expanded"),
    # Chosen on the TUNE split of both retrieval corpora: fresh's fitted envelopes and expanded
    # sub-queries lost to the spec's (bench/results/tune_focused_round1.md), anchoring the
    # subject added nothing once BM25 carries the subject's words (..._round2.md), and
    # document support lifted every measure on both corpora (..._round3.md).
    # The length contract keeps a long run to the words asked: without it a run
    # goes on to its window limit or its stale stop (bench/results/long.md).
    # Planning by the packed facts: with the outline's leading sections, 6 of
    # focused's 10 windows on two Python-docs pages held at most one fact of the section they
    # were asked for, and the model wrote it from memory (docs/retrieval.md).
    # Not `resume: "prefill"`: chosen on the two largest TUNE pages (restating in windows 2+
    # 13.3% -> 4.5%, bench/results/long-tune.md), it did not hold on the report tasks (restating
    # 14.6% -> 14.3%, the reference model looping in 12 windows instead of 7;
    # bench/results/long.md), so it stays an opt-in (docs/length.md).
    # The section pool: chosen on the tuning tasks of `bench/shapes.py` (tasks whose
    # material is 2-5 man pages): material sent 67% -> 93%, false exhaustions 4 -> 1 of 5,
    # single-page tasks unchanged (100% sent, no stale window); docs/retrieval.md.
    "focused": SessionOptions(memory="facts", lexical="bm25", stale="stop", length="contract",
                              documents="support", plan="packed", pool="sections",
                              citations="numbers"),
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
