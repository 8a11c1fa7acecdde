"""The envelope budget counts the whole prompt (issue 22; docs/design.md §3.16, "The budget
counts the whole prompt"): every window's prompt, as the writer sends it — system and user
messages with the chat format's framing, counted with the counter the budget uses (cl100k,
`cdr.writers.base.estimate_prompt_tokens`) — fits the context less the generation reserve,
C − G, whatever the plan, the closing instructions and the facts' labels add.

Structure only, no model and no timing. A 12-window run on the built-in types knowledge base
with one more document whose facts carry long labels (a 300-character title and a five-deep
section path), under an outline of long section titles (the longest plan lines), through:
the prompt builder with a prose writer (with and without the length contract), the same with
a writer that pastes facts (which plans every section), the `openai` writer through the CLI
against a loopback server, and the `local` writer on a stand-in for llama.cpp (its real
tokenizer when the reference model is cached). Before the fix, the test writer's prompts at
3,072 / 1,024 held 2,400–2,670 tokens against 2,048 budgeted (docs/length.md).
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from cdr.ckf import CKF, ingest
from cdr.cli import app
from cdr.session import IN_PROGRESS
from cdr.text.prompt_format import parse_prompt
from cdr.text.tokens import count_tokens
from cdr.window.loop import GenerationConfig, Generator, WindowEvent
from cdr.window.prompt import fact_label, fact_lines
from cdr.writers import get_writer
from cdr.writers.base import estimate_prompt_tokens
from cdr.writers.local import reference_vocabulary
from tests.chat_server import ChatServer
from tests.conftest import BUILTIN_TYPES_TASK
from tests.prose_writer import ProseWriter

CONTEXT, GENERATION = 3072, 1024  # the long-document benchmark's window (bench/long_llm.py)
ROOM = CONTEXT - GENERATION
WINDOWS = 12
WORDS = 14_000  # more than 12 windows carry: the length contract never stops a run early
WRITTEN_WORDS = 150  # what the test writers write a window (cut, as a model is at max_tokens)
LONG_TITLE = " ".join(["Built-in types of the Python language, in depth"] * 7)  # 335 chars
LONG_OUTLINE = (
    "Truth value testing, the Boolean operations and how an object defines its own truth\n"
    "Numeric types int, float and complex, their constructors, operations and the tower\n"
    "Sequence types list, tuple and range, the operations every sequence shares, mutability\n"
    "Text sequence type str, the string methods, and formatting strings in several ways\n"
    "Mapping types dict, dictionary views, and the methods that read and change a mapping\n"
    "Functions, methods, modules and code objects as runtime objects with special attributes\n"
)
# pydoc topics on the same subject that the types knowledge base does not hold
DEEP_TOPICS = (("Numbers, truth and comparison", "Numeric types and how they are emulated",
                "numeric-types"),
               ("Numbers, truth and comparison", "Comparisons between values", "comparisons"),
               ("Numbers, truth and comparison", "The Boolean operations", "booleans"),
               ("Sequences and objects", "Sequence types and how they are emulated",
                "sequence-types"),
               ("Sequences and objects", "Type objects and the null object",
                "bltin-type-objects"),
               ("Sequences and objects", "Code objects", "bltin-code-objects"),
               ("Sequences and objects", "Special attributes", "specialattrs"))
FACT_LABEL = re.compile(r"^\[F\d+\] \((?P<label>.*)\)$", re.M)
LONG = {"ranking": "relevance", "length": "contract"}  # runs to the window limit


def _deep_document() -> str:
    """A Markdown page whose facts sit five headings deep under a 335-character title."""
    from pydoc_data.topics import topics

    parts = [f"# {LONG_TITLE}", "", "## Reference material on the standard type hierarchy", "",
             "### Objects, values and types as the interpreter sees them", ""]
    group = ""
    for heading, sub, topic in DEEP_TOPICS:
        if heading != group:
            parts += [f"#### {heading}", ""]
            group = heading
        parts += [f"##### {sub}", "", topics[topic], ""]
    return "\n".join(parts)


@pytest.fixture(scope="module")
def deep_ckf(types_ckf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in types knowledge base plus the deep-labelled page."""
    root = tmp_path_factory.mktemp("deep-ckf")
    path = root / "ckf"
    shutil.copytree(types_ckf_path, path)
    page = root / "docs" / "types-in-depth.md"
    page.parent.mkdir()
    page.write_text(_deep_document(), encoding="utf-8")
    with CKF.open(path) as ckf:
        report = ingest(ckf, [str(page)], source_type="official")
    assert report.facts_added > 10, report
    return path


def _cut(messages: list[dict[str, str]], call: int) -> tuple[str, str]:
    """The window's planned sections written from its facts, cut at `WRITTEN_WORDS` words
    (finish "length", as a model cut at max_tokens) and ending with the call's number: a
    model does not write the same window twice, and the next prompt quotes where a
    continued section's text stopped."""
    words = get_writer("extractive").generate(messages, 100_000).text.split(" ")
    return (" ".join([*words[:WRITTEN_WORDS], f"Call {call} ends here."]),
            "length" if len(words) > WRITTEN_WORDS else "stop")


def CutWriter() -> ProseWriter:
    """A prose writer whose windows `_cut` ends: the loop plans, fits and prompts as for a
    model."""
    return ProseWriter(cut=_cut)


class PastingWriter(ProseWriter):
    """Pastes facts (the extractive writer's capability): the loop plans every section."""

    name = "pasting"
    pastes_facts = True

    def __init__(self) -> None:
        super().__init__(cut=_cut)


def _run(ckf_path: Path, writer: Any, **options: Any) -> list[WindowEvent]:
    cfg = GenerationConfig(max_windows=WINDOWS, words=WORDS, context_tokens=CONTEXT,
                           generation_tokens=GENERATION, **options)
    gen = Generator(CKF.open(ckf_path), writer, cfg)
    session = gen.start(BUILTIN_TYPES_TASK, LONG_OUTLINE)
    events = []
    while session.status == IN_PROGRESS:
        events.append(gen.step(session))
    return events


ARMS = {
    "contract": (CutWriter, LONG),  # the length contract's plan (bench-long's arm)
    "focused": (CutWriter, {"profile": "focused"}),  # the recommended profile
    "spec": (CutWriter, {}),  # no contract: the plan is fitted after facts are assigned
    "pasting": (PastingWriter, {}),  # every section planned: the longest plan
}


@pytest.fixture(scope="module")
def runs(deep_ckf: Path) -> dict[str, tuple[Any, list[WindowEvent]]]:
    """Each arm's run, made once for the module's tests."""
    out = {}
    for arm, (make, options) in ARMS.items():
        writer = make()
        out[arm] = (writer, _run(deep_ckf, writer, **options))
    return out


def _labels(messages: list[dict[str, str]]) -> list[str]:
    return [m["label"] for m in FACT_LABEL.finditer(messages[-1]["content"])]


@pytest.mark.parametrize("arm", list(ARMS))
def test_every_window_prompt_fits_the_context_less_the_generation(runs: dict, arm: str):
    """Every prompt the writer receives fits C − G, in windows whose facts carry the long
    labels and in those that plan and continue the most sections."""
    writer, events = runs[arm]
    tokens = [estimate_prompt_tokens(m) for m in writer.messages]
    assert len(tokens) >= 5 and all(t <= ROOM for t in tokens), (ROOM, tokens)
    assert all(m == GENERATION for m in writer.max_tokens)
    # The run exercised what the budget used to leave out: labels of 300+ characters, plans
    # of several long section lines, and continued sections quoted in the closing lines.
    assert any(len(label) >= 300 for m in writer.messages for label in _labels(m))
    # (a model writer's window plans what its ~600 words cover: one of these long sections;
    # a paster plans them all)
    assert max(len(e.prepared.plan) for e in events) >= (4 if arm == "pasting" else 1)
    assert any("was begun earlier" in m[-1]["content"] for m in writer.messages)
    if arm == "contract":
        assert len(events) == WINDOWS


def _bare(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The prompt with its facts taken out: no fact lines, no refs on the plan's lines."""
    user = messages[-1]["content"]
    head, _, rest = user.partition("\nFacts:\n")
    head = re.sub(r"\): F\d+(?:, F\d+)*$", "): ", head, flags=re.M)
    write = rest.find("Write this part now:")
    tail = rest[write:] if write >= 0 else ""
    return [*messages[:-1], {"role": "user", "content": f"{head}\nFacts:\n\n{tail}"}]


@pytest.mark.parametrize("arm", list(ARMS))
def test_a_full_envelope_still_fills_what_the_prompt_leaves(runs: dict, arm: str,
                                                            deep_ckf: Path):
    """Counting the whole prompt does not starve the envelope: in a window where ranked facts
    were left out for want of room, the packed facts, as the prompt lists them, take most of
    what the rest of that window's prompt leaves of C − G. A model writer's plan is known
    before packing (its sections are chosen first), so its envelope fills it to within a
    fact; a paster's plan holds the sections its facts went to, which packing decides, so
    when more facts would bring in more sections its envelope can stop short."""
    writer, events = runs[arm]
    written = [e for e in events if e.usage or e.output]
    ckf = CKF.open(deep_ckf)
    # what the room left after packing can be short of: the dearest fact line of the KB
    dearest = max(count_tokens("\n".join(fact_lines("F99", fact_label(f), f.content)) + "\n")
                  for f in ckf.facts(np.arange(ckf.n_rows)))
    shares, within = [], []
    for event, messages in zip(written, writer.messages, strict=True):
        env = event.prepared.envelope
        if env.skipped == 0 or not len(env):
            continue
        overhead = estimate_prompt_tokens(_bare(messages))
        facts = sum(count_tokens("\n".join(fact_lines(f"F{i + 1}", fact_label(f), f.content))
                                 + "\n") for i, f in enumerate(event.prepared.facts))
        shares.append(facts / (ROOM - overhead))
        within.append(facts + dearest >= ROOM - overhead)
    assert shares, "no window was full"
    if arm == "pasting":
        assert min(shares) >= 0.65 and sum(shares) / len(shares) >= 0.85, shares
    else:
        assert all(within) and sum(shares) / len(shares) >= 0.9, shares  # within a fact


# ------------------------------------------------------------- the openai writer, via the CLI


@pytest.fixture(scope="module")
def server() -> Iterator[ChatServer]:
    calls = iter(range(1, 10_000))
    with ChatServer(reply=lambda messages: _cut(messages, next(calls))[0]) as s:
        yield s


def test_the_openai_writer_sends_prompts_that_fit(server: ChatServer, deep_ckf: Path,
                                                  tmp_path: Path):
    """`cdr generate --writer openai`: every chat request the upstream receives fits C − G
    with its `max_tokens` of G, counted on the request's own messages."""
    outline = tmp_path / "outline.txt"
    outline.write_text(LONG_OUTLINE, encoding="utf-8")
    trace = tmp_path / "t.json"
    res = CliRunner().invoke(app, [
        "generate", BUILTIN_TYPES_TASK, "--ckf", str(deep_ckf), "--outline", str(outline),
        "--writer", "openai", "--llm-base-url", server.openai_base_url,
        "--llm-model", "loopback-test-server", "--words", str(WORDS), "--windows",
        str(WINDOWS), "--profile", "spec", "--ranking", "relevance", "--length", "contract",
        "--context-tokens", str(CONTEXT), "--generation-tokens", str(GENERATION),
        "--trace", str(trace)], env={"CDR_LLM_API_KEY": "test-key"})
    assert res.exit_code == 0, res.output
    requests = [r.body for r in server.requests if r.path.endswith("/chat/completions")]
    assert len(requests) == len(json.loads(trace.read_text())["windows"]) == WINDOWS
    tokens = [estimate_prompt_tokens(b["messages"]) for b in requests]
    assert all(t <= ROOM for t in tokens), (ROOM, tokens)
    assert all(b["max_tokens"] == GENERATION for b in requests)
    assert any(len(label) >= 300 for b in requests for label in _labels(b["messages"]))


# ----------------------------------------------------- the local writer, on a stand-in model


def _model_tokenizer() -> Any:
    """The reference model's own tokenizer (its vocabulary only, no weights), else None."""
    return reference_vocabulary()


class StandInLlama:
    """llama.cpp as the local writer sees it: `tokenize` (the reference model's tokenizer
    when it is cached, else cl100k) and a streamed chat completion that records what it was
    asked and writes like the test writers."""

    def __init__(self, vocab: Any) -> None:
        self.vocab = vocab
        self.asked: list[tuple[list[dict[str, str]], int]] = []

    def tokenize(self, data: bytes, add_bos: bool = False) -> list[int]:
        if self.vocab is not None:
            return list(self.vocab.tokenize(data, add_bos=add_bos))
        from cdr.text.tokens import count_tokens

        return list(range(count_tokens(data.decode())))

    def create_chat_completion(self, messages: list[dict[str, str]], max_tokens: int,
                               **_: Any) -> Iterator[dict[str, Any]]:
        self.asked.append((messages, max_tokens))
        text, finish = _cut(messages, len(self.asked))
        yield {"choices": [{"delta": {"content": text}, "finish_reason": None}]}
        yield {"choices": [{"delta": {}, "finish_reason": finish}]}


def test_the_local_writer_gets_prompts_that_fit(deep_ckf: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch):
    """The `local` writer at the context every face gives it (1.3 × C, at least 4,096): the
    messages it receives fit C − G on the budget's counter, and on the model's own tokenizer
    (when cached) no window's generation is cut short by the context."""
    from cdr.writers import local

    llama = StandInLlama(_model_tokenizer())
    monkeypatch.setattr(local, "load_model", lambda *a, **k: llama)
    model = tmp_path / "stand-in.gguf"
    model.write_bytes(b"")
    writer = local.LocalWriter(model_path=str(model), n_ctx=max(4096, round(CONTEXT * 1.3)))
    events = _run(deep_ckf, writer, **LONG)
    assert len(events) == WINDOWS == len(llama.asked)
    tokens = [estimate_prompt_tokens(m) for m, _ in llama.asked]
    assert all(t <= ROOM for t in tokens), (ROOM, tokens)
    # the writer asked the model for the whole G every window: its context held the prompt
    assert all(limit == GENERATION for _, limit in llama.asked)
    assert all(t.prompt_tokens + GENERATION <= writer.n_ctx for t in writer.reuse.timings)


# ------------------------------------------------- the envelope is what the prompt lists


def _listed(messages: list[dict[str, str]]) -> dict[str, str]:
    """The facts a prompt lists, by ref (F1, F2… in envelope layout order)."""
    return parse_prompt(messages[-1]["content"])[1]


@pytest.mark.parametrize("arm", list(ARMS))
def test_every_packed_fact_is_in_the_window_prompt(runs: dict, arm: str):
    """The envelope is what the writer is shown (docs/design.md §3.17, "The envelope is what
    the prompt lists"): every packed fact — what the trace records, fact memory and the stale
    stop count as sent, and Exit 3 judges — is listed in that window's prompt, with its text.
    Before, the spec profile with a model writer packed for every open section and listed
    only the facts of the one section its plan kept: 1 of 25–46 facts in most windows."""
    writer, events = runs[arm]
    written = [e for e in events if e.usage or e.output]
    assert len(written) == len(writer.messages) >= 5
    for event, messages in zip(written, writer.messages, strict=True):
        listed = _listed(messages)
        facts = event.prepared.facts
        assert len(facts) == len(event.prepared.envelope) > 0
        assert listed == {f"F{i + 1}": f.content.strip() for i, f in enumerate(facts)}, (
            event.number, len(listed), len(facts))
        cited = {ref for s in event.prepared.plan for ref in s.fact_refs}
        assert cited == set(listed)


@pytest.mark.parametrize(("context", "generation"), [(2048, 320), (4096, 1024)])
def test_the_spec_profile_trace_envelope_is_what_the_writer_was_sent(
        server: ChatServer, deep_ckf: Path, tmp_path: Path, context: int, generation: int):
    """`cdr generate --writer openai` under the default (spec) profile, at the bench-llm
    window (2,048 / 320) and the CLI's default (4,096 / 1,024): each window's envelope in the
    trace is the facts its chat request listed, one for one, in the same order."""
    outline = tmp_path / "outline.txt"
    outline.write_text(LONG_OUTLINE, encoding="utf-8")
    trace = tmp_path / "t.json"
    before = len(server.requests)
    res = CliRunner().invoke(app, [
        "generate", BUILTIN_TYPES_TASK, "--ckf", str(deep_ckf), "--outline", str(outline),
        "--writer", "openai", "--llm-base-url", server.openai_base_url,
        "--llm-model", "loopback-test-server", "--words", "3000", "--windows", "5",
        "--context-tokens", str(context), "--generation-tokens", str(generation),
        "--trace", str(trace)], env={"CDR_LLM_API_KEY": "test-key"})
    assert res.exit_code == 0, res.output
    requests = [r.body for r in server.requests[before:]
                if r.path.endswith("/chat/completions")]
    windows = [w for w in json.loads(trace.read_text())["windows"] if w["output"]]
    assert len(windows) == len(requests) >= 3
    for window, body in zip(windows, requests, strict=True):
        labels = _labels(body["messages"])
        assert len(labels) == len(window["envelope"]) > 0, (window["number"], len(labels))
        assert labels == [f["section"] or f["source"] for f in window["envelope"]]


# --------------------------------------------- prepare's repacking, over a grid of windows

GRID_SIZES = ((1280, 256), (2048, 320), (3072, 1024))  # a tight window, bench-llm's, bench-long's
# The faces' default, and it with the task's pool alone and a document's support its one best
# fact (`pool: "task"`, `support_top_n` 1: the default before the section pool and before
# multi-document support): with today's default no prose cell's plan came out short of its
# count, and the grid must pin both second packings for either writer.
GRID_PROFILES = ("spec", "focused", "focused/pool-task/top-1")
GRID_WRITERS = {"pasting": PastingWriter, "prose": CutWriter}
GRID_WINDOWS = 4


class _Attempts:
    """What `Generator.prepare` did on its way to a window's prompt: the reserve of each
    packing (`make_budget`'s `reserve`) and each rendered prompt's count, which `at_least`
    (attempt number → tokens) can raise, as a plan the prompt's shape did not foresee
    would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch,
                 at_least: dict[int, int] | None = None) -> None:
        from cdr.window import loop

        self.reserves: list[int] = []
        self.counts: list[int] = []
        self.at_least = at_least or {}
        make, estimate = loop.make_budget, loop.estimate_prompt_tokens

        def spy_budget(*args: Any, **kwargs: Any) -> Any:
            self.reserves.append(int(kwargs.get("reserve", 0)))
            return make(*args, **kwargs)

        def spy_count(messages: list[dict[str, str]]) -> int:
            self.counts.append(max(estimate(messages), self.at_least.get(len(self.counts), 0)))
            return self.counts[-1]

        monkeypatch.setattr(loop, "make_budget", spy_budget)
        monkeypatch.setattr(loop, "estimate_prompt_tokens", spy_count)

    def clear(self) -> None:
        self.reserves.clear()
        self.counts.clear()

    @property
    def repacked(self) -> bool:
        """A rendered prompt overflowed and the window was packed again with more reserved."""
        return any(b > a for a, b in itertools.pairwise(self.reserves))

    @property
    def widened(self) -> bool:
        """The plan came out shorter than counted and the window was packed with less."""
        return any(b < a for a, b in itertools.pairwise(self.reserves))


def _grid_generator(ckf_path: Path, size: tuple[int, int], profile: str, writer: str,
                    windows: int = GRID_WINDOWS) -> Generator:
    context, generation = size
    name, _, rest = profile.partition("/pool-")
    pool, _, top_n = rest.partition("/top-")
    cfg = GenerationConfig(max_windows=windows, words=3000, context_tokens=context,
                           generation_tokens=generation,
                           **({} if name == "spec" else {"profile": name}),
                           **({"pool": pool} if pool else {}),
                           **({"support_top_n": int(top_n)} if top_n else {}))
    return Generator(CKF.open(ckf_path), GRID_WRITERS[writer](), cfg)


@pytest.fixture(scope="module")
def grid(deep_ckf: Path) -> list[dict[str, Any]]:
    """Every window of a short run in each cell of the grid, as `prepare` made it, with the
    reserves of its packings."""
    out = []
    with pytest.MonkeyPatch.context() as mp:
        attempts = _Attempts(mp)
        for size in GRID_SIZES:
            for profile in GRID_PROFILES:
                for writer in GRID_WRITERS:
                    gen = _grid_generator(deep_ckf, size, profile, writer)
                    session = gen.start(BUILTIN_TYPES_TASK, LONG_OUTLINE)
                    while session.status == IN_PROGRESS:
                        attempts.clear()
                        prepared = gen.prepare(session)
                        out.append({"cell": (size, profile, writer), "prepared": prepared,
                                    "room": size[0] - size[1],
                                    "repacked": attempts.repacked,
                                    "widened": attempts.widened})
                        gen.write_and_complete(session, prepared)
    return out


def test_every_grid_window_fits_and_lists_its_whole_envelope(grid: list[dict[str, Any]]):
    """In every cell — tight and roomy windows, the spec and focused profiles, a paster and a
    prose writer, every window of the run — the prompt `prepare` hands out fits C − G and
    lists every packed fact, each cited by the plan."""
    assert len(grid) >= len(GRID_SIZES) * len(GRID_PROFILES) * len(GRID_WRITERS) * 2
    for window in grid:
        prepared = window["prepared"]
        assert estimate_prompt_tokens(prepared.messages) <= window["room"], window["cell"]
        facts = prepared.facts
        assert len(facts) == len(prepared.envelope) == len(prepared.rows)
        if not facts:
            continue
        listed = _listed(prepared.messages)
        assert listed == {f"F{i + 1}": f.content.strip() for i, f in enumerate(facts)}
        assert {ref for s in prepared.plan for ref in s.fact_refs} == set(listed)


def test_the_grid_takes_both_repacking_paths(grid: list[dict[str, Any]]):
    """The grid is one that pins both of `prepare`'s second packings: a plan shorter than
    counted (a paster's sections that got no facts) packed again with the room it left,
    and a prompt that then came out longer than C − G packed again with the excess
    reserved. Without both, a change to either path would pass the test above unseen."""
    widened = [w for w in grid if w["widened"]]
    repacked = [w for w in grid if w["repacked"]]
    assert len(widened) >= 5 and len(repacked) >= 2, (len(widened), len(repacked))
    assert any(w["cell"][2] == "prose" for w in widened)


def test_a_prompt_longer_than_counted_is_packed_again_with_the_excess_reserved(
        deep_ckf: Path, monkeypatch: pytest.MonkeyPatch):
    """A first prompt that comes out 25 tokens over C − G (a plan the shape did not foresee)
    is packed again with those 25 tokens reserved, and what the window keeps fits."""
    gen = _grid_generator(deep_ckf, (2048, 320), "spec", "prose")
    session = gen.start(BUILTIN_TYPES_TASK, LONG_OUTLINE)
    room = 2048 - 320
    plain = gen.prepare(session)
    attempts = _Attempts(monkeypatch, at_least={0: room + 25})
    prepared = gen.prepare(session)
    assert attempts.reserves[:2] == [0, 25] and attempts.counts[0] == room + 25
    assert attempts.counts[-1] <= room
    assert estimate_prompt_tokens(prepared.messages) <= room
    assert prepared.envelope.budget.envelope == plain.envelope.budget.envelope - 25


def test_a_widening_that_overflows_twice_keeps_the_first_fit(
        deep_ckf: Path, monkeypatch: pytest.MonkeyPatch):
    """A paster's window whose plan came out shorter than counted is packed once more with
    the room it left; should that packing overflow, and its correction too, the window
    keeps the packing that fit: the one it would have had without widening."""
    from cdr.window import loop

    gen = _grid_generator(deep_ckf, (2048, 320), "spec", "pasting")
    session = gen.start(BUILTIN_TYPES_TASK, LONG_OUTLINE)
    with monkeypatch.context() as mp:
        mp.setattr(loop, "WIDEN_MIN_TOKENS", 10**6)
        unwidened = gen.prepare(session)
    attempts = _Attempts(monkeypatch)
    widened = gen.prepare(session)
    assert attempts.widened and len(widened.envelope) > len(unwidened.envelope)
    attempts.clear()
    attempts.at_least = {1: 2048 - 320 + 1, 2: 2048 - 320 + 1}  # both later packings overflow
    kept = gen.prepare(session)
    assert len(attempts.reserves) == 3 and attempts.reserves[2] > attempts.reserves[1]
    assert kept.rows.tolist() == unwidened.rows.tolist()
    assert kept.plan == unwidened.plan and kept.messages == unwidened.messages


def test_a_repacked_window_prices_each_fact_once(deep_ckf: Path,
                                                 monkeypatch: pytest.MonkeyPatch):
    """A window packed three times (widened, then repacked over the excess) counts each
    fact's label and text once: the later packings price from what the first counted."""
    from cdr.window import loop

    priced: list[tuple[str, str]] = []
    count = loop.fact_prompt_tokens

    def spy(facts: list[tuple[str, str]]) -> Any:
        priced.extend(facts)
        return count(facts)

    monkeypatch.setattr(loop, "fact_prompt_tokens", spy)
    gen = _grid_generator(deep_ckf, (2048, 320), "spec", "pasting")
    session = gen.start(BUILTIN_TYPES_TASK, LONG_OUTLINE)
    attempts = _Attempts(monkeypatch)
    prepared = gen.prepare(session)
    assert len(attempts.reserves) == 3 and attempts.widened and attempts.repacked
    assert len(priced) == len(set(priced)) > len(prepared.facts) > 0
