"""Request and response bodies (they are also the OpenAPI schema the fuzz tests run from).

Bounds on sizes are part of the contract: they keep one request's cost (embedding, packing)
bounded, and make the schema honest about what the gateway accepts.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator
from pydantic_core import PydanticCustomError

from cdr.gateway.limits import check_text
from cdr.options import (
    FACE_DEFAULTS,
    MAX_WINDOWS_LIMIT,
    OPTION_CHOICES,
    ProfileName,
    meaning,
    wire_names,
)
from cdr.ranking import RankingMode

MAX_TASK_CHARS = 20_000
MAX_OUTLINE_ITEMS = 50
MAX_OUTLINE_CHARS = 20_000
MAX_WINDOW_TEXT_CHARS = 400_000
MAX_WORDS = 100_000
MAX_SUB_QUERIES = 20
MAX_MESSAGE_CHARS = 100_000
MAX_MESSAGES_CHARS = 400_000


class _Strict(BaseModel):
    """Unknown fields refused; no coercion (`true` is not 1, `"300"` is not 300)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class _CleanText:
    """Top-level request bodies: every string in the raw JSON is checked for invalid Unicode
    (`limits.check_text`) before any field is validated."""

    @model_validator(mode="before")
    @classmethod
    def _clean(cls, data: Any) -> Any:
        return check_text(data)


def _too_long(length: int, limit: int, what: str = "text") -> PydanticCustomError:
    return PydanticCustomError("string_too_long",
                               "{what} has {length} characters; the limit is {limit}",
                               {"what": what, "length": length, "limit": limit})


def option_field(wire: str, **bounds: Any) -> Any:
    """A request field for the run option sent as `wire` (`cdr.options.RunOptions`): optional
    (omitted = the server's default), described by the option's one meaning, and publishing
    the option's default on the faces (`cdr.options.FACE_DEFAULTS`) in the schema; `bounds`
    are this gateway's limits on one request."""
    name = wire_names()[wire]
    default = getattr(FACE_DEFAULTS, name)
    extra = {"default": default} if default is not None else None
    return Field(None, description=meaning(name), json_schema_extra=extra, **bounds)


def _rule_fields() -> dict[str, Any]:
    """One optional field per session rule of `cdr.options.OPTION_CHOICES`: its choices as
    the field's enum, its meaning and the faces' default from the table, so a rule added there
    is a field of every request with nothing retyped here."""
    return {name: (Literal[choices] | None, option_field(name))
            for name, choices in OPTION_CHOICES.items()}


_RuleOptions: type[_Strict] = create_model("_RuleOptions", __base__=_Strict, **_rule_fields())


class GenerationOptions(_RuleOptions):  # type: ignore[misc,valid-type]
    """How to run the window loop; every field is optional (server defaults apply). The
    fields are the run options a request may set (`cdr.options.wire_names`); the session
    rules come from the option table (`_RuleOptions`)."""

    outline: str | list[str] | None = Field(
        default=None, description="Sub-queries: a Markdown/plain outline (one per line) or a list. "
        "Omitted: decomposed automatically (by the LLM writer, else from the CKF).")
    max_windows: int | None = option_field("max_windows", ge=1, le=MAX_WINDOWS_LIMIT)
    words: int | None = option_field("words", ge=1, le=MAX_WORDS)
    ranking: RankingMode | None = option_field("ranking")
    sub_queries: int | None = option_field("sub_queries", ge=1, le=MAX_SUB_QUERIES)
    window_tokens: int | None = option_field("window_tokens", ge=16, le=32_768)
    context_tokens: int | None = option_field("context_tokens", ge=256, le=2_000_000)
    # Opt-in options beyond the spec (cdr.options), fixed into the session at its start: the
    # profile here, each rule from the option table (`_RuleOptions`).
    profile: ProfileName | None = option_field("profile")

    def run_options(self) -> dict[str, Any]:
        """The options this request set, by their `RunOptions` names (`window_tokens` is
        `generation_tokens`), in the options' order; what it left out is not there."""
        given = {name: getattr(self, wire) for wire, name in wire_names().items()}
        return {k: v for k, v in given.items() if v is not None}

    @field_validator("outline")
    @classmethod
    def _outline(cls, v: str | list[str] | None) -> str | list[str] | None:
        if v is None:
            return v
        if isinstance(v, list):
            if not v or len(v) > MAX_OUTLINE_ITEMS:
                raise ValueError(f"outline list must have 1..{MAX_OUTLINE_ITEMS} items")
            if any(not isinstance(x, str) or not x.strip() for x in v):
                raise ValueError("outline items must be non-empty strings")
            if sum(len(x) for x in v) > MAX_OUTLINE_CHARS:
                raise ValueError(f"outline exceeds {MAX_OUTLINE_CHARS} characters")
            if any("\n" in x or "\r" in x for x in v):
                raise ValueError("an outline item must be a single line")
            return v
        if len(v) > MAX_OUTLINE_CHARS:
            raise ValueError(f"outline exceeds {MAX_OUTLINE_CHARS} characters")
        if not any(line.strip() for line in v.splitlines()):
            raise ValueError("outline is empty (expected one sub-query per line)")
        return v

    def outline_text(self) -> str | None:
        if isinstance(self.outline, list):
            return "\n".join(x.strip() for x in self.outline)
        return self.outline


# ------------------------------------------------------------------ OpenAI chat completions


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str = Field(..., max_length=64)
    text: str | None = Field(None, max_length=MAX_MESSAGE_CHARS)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = Field(
        None, description=f"At most {MAX_MESSAGE_CHARS} characters per message; the task "
        f"(the last user message) at most {MAX_TASK_CHARS}.")

    @field_validator("content", mode="before")
    @classmethod
    def _content_length(cls, v: Any) -> Any:
        if isinstance(v, str) and len(v) > MAX_MESSAGE_CHARS:
            raise _too_long(len(v), MAX_MESSAGE_CHARS, "message content")
        if isinstance(v, list) and len(v) > 256:
            raise PydanticCustomError("too_long", "at most 256 content parts", {})
        return v

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content if p.type == "text" and p.text)


class ChatCrpOptions(GenerationOptions):
    """`crp` of a chat completion: the generation options, and which knowledge base."""

    kb: str | None = Field(None, min_length=1, max_length=64,
                           description="The knowledge base to write from (else `model`'s "
                           "`cdr/<name>`, else the default KB).")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool = False


class ChatCompletionRequest(_CleanText, BaseModel):
    """OpenAI's request. `max_tokens` (or `max_completion_tokens`) caps the whole document:
    each window writes at most what is left of it, and a run that reaches it stops with
    `finish_reason: "length"` (its session stays in progress, to go on with). Only one choice
    is written (`n` 1). Sampling fields (`temperature`, `top_p`...) are accepted and left to
    the writer's configuration: each window's budget comes from the envelope (SPEC-003)."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str = Field("cdr", max_length=256)
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, description="Choices to write: only 1 (one document is one "
                          "CDR session).")
    max_tokens: int | None = Field(None, ge=1, le=10_000_000, description="A cap on the "
                                   "whole document's completion tokens (all windows).")
    max_completion_tokens: int | None = Field(None, ge=1, le=10_000_000, description="OpenAI's "
                                              "newer name for `max_tokens`; wins when both "
                                              "are sent.")

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise PydanticCustomError("one_choice", "n={n}: the gateway writes one choice (a "
                                      "document is one CDR session); send n=1 or leave it out",
                                      {"n": v})
        return v

    def token_cap(self) -> int | None:
        """The document's cap on completion tokens, if the client set one."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens
    crp: ChatCrpOptions | None = Field(
        None, description="CDR options (OpenAI clients send them with `extra_body`).")

    @model_validator(mode="after")
    def _bounded(self) -> ChatCompletionRequest:
        """The whole conversation and the task have their own limits (the task is embedded
        and planned from, like a session's `task`)."""
        total = sum(len(m.text()) for m in self.messages)
        if total > MAX_MESSAGES_CHARS:
            raise _too_long(total, MAX_MESSAGES_CHARS, "messages together")
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i].role == "user":
                n = len(self.messages[i].text())
                if n > MAX_TASK_CHARS:
                    raise PydanticCustomError(
                        "string_too_long", "the task (last user message) has {length} "
                        "characters; the limit is {limit}",
                        {"field": f"messages.{i}.content", "length": n,
                         "limit": MAX_TASK_CHARS})
                break
        return self

    def task(self) -> str | None:
        """The last user message's text: what to write."""
        for m in reversed(self.messages):
            if m.role == "user":
                return m.text()
        return None


class ChatUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CitationSource(BaseModel):
    """One entry of a citing run's sources list (`citations` on), numbered as the markers."""

    number: int
    fact_id: str
    source: str = Field(description="Where the fact was ingested from, as the gateway shows "
                        "paths: never a server directory.")
    section: str
    title: str
    excerpt: str = Field(description="The fact's opening words.")


class UrlCitation(BaseModel):
    model_config = ConfigDict(extra="allow")
    start_index: int = Field(description="Where the cited run of sentences starts in content.")
    end_index: int = Field(description="Where it ends; its marker [n] follows.")
    url: str = Field(description="The fact's source (see CitationSource.source).")
    title: str
    number: int = Field(description="The number the content's marker shows.")
    fact_id: str


class Annotation(BaseModel):
    """OpenAI's annotation shape: one per cited run of sentences and fact."""

    type: Literal["url_citation"] = "url_citation"
    url_citation: UrlCitation


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    annotations: list[Annotation] | None = Field(
        None, description="A citing run's citations over spans of content (`citations` on; "
        "the streamed response gives them in the delta of its last chunk).")


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    finish_reason: str


class CrpResult(BaseModel):
    """CDR's view of the run (also in the last streamed chunk's `crp` field)."""

    session_id: str | None = None
    token: str | None = None
    status: str
    windows: int
    max_windows: int
    completeness: float
    headers: dict[str, str]
    sources: list[CitationSource] | None = Field(
        None, description="A citing run's sources list, by number.")


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage
    crp: CrpResult
    citations: list[str] | None = Field(
        None, description="A citing run's sources by number (item n-1 is [n]), as search "
        "APIs list them.")


# ------------------------------------------------------------------ sidecar


class SessionCreate(_CleanText, GenerationOptions):
    task: str = Field(..., min_length=1, max_length=MAX_TASK_CHARS, description="What to write.")

    @field_validator("task")
    @classmethod
    def _task(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("task is blank")
        return v


class SubQueryOut(BaseModel):
    id: str
    text: str
    expected_words: int


class SessionCreated(BaseModel):
    session_id: str
    token: str
    status: str
    embedding_model: str
    ranking: str
    max_windows: int
    sub_queries: list[SubQueryOut]
    headers: dict[str, str]


class EnvelopeFact(BaseModel):
    ref: str = Field(..., description="How the prompt cites it: F1, F2...")
    fact_id: str
    source: str
    section: str
    content: str
    relevance: float
    novelty: float
    residual_pull: float
    ngram_penalty: float
    score: float
    tokens: int


class PlanItem(BaseModel):
    title: str
    target_words: int
    fact_refs: list[str]


class PromptMessage(BaseModel):
    role: str
    content: str


class EnvelopeResponse(BaseModel):
    session_id: str
    window: int = Field(..., description="The number of the window this envelope is for.")
    max_windows: int
    anchor: str = Field(..., description="The Residual Task Anchor (SPEC-024 §4).")
    facts: list[EnvelopeFact]
    plan: list[PlanItem]
    messages: list[PromptMessage] = Field(
        ..., description="Chat messages to send to your LLM for this window (empty when the "
        "envelope is empty: the session then ended as ckf-exhausted, write nothing).")
    max_tokens: int
    etag: str
    saturation: float
    residual: list[str]
    status: str
    done: bool
    token: str
    headers: dict[str, str]


class WindowSubmit(_CleanText, _Strict):
    text: str = Field(..., max_length=MAX_WINDOW_TEXT_CHARS,
                      description="The window your LLM wrote from the envelope's messages.")
    etag: str | None = Field(None, max_length=128, description="The envelope's etag; when "
                             "given, it must match the envelope prepared for this window.")
    finish_reason: Literal["stop", "length", "content_filter"] | None = Field(
        None, description="How your LLM's answer ended, in OpenAI's words (default `stop`). "
        "`length` (cut at max_tokens): under the length contract the window's last section is "
        "continued by the next window instead of counting as written whole.")


class AddressedOut(BaseModel):
    id: str
    depth: float


class DpeReportOut(BaseModel):
    addressed: list[AddressedOut]
    words: dict[str, int]
    paragraphs: int
    unattributed_words: int


class SentenceCitationOut(BaseModel):
    start: int = Field(description="Offset of the sentence in the window's clean text.")
    end: int
    facts: list[str] = Field(description="The fact ids it cites, best supported first.")
    numbers: list[int]
    support: list[float]
    status: Literal["cited", "repaired", "unsupported"] = Field(
        description="cited: the writer's citation stood; repaired: the supporting fact was "
        "put in; unsupported: no fact given to the window supports it.")
    paragraph: int = 0


class WindowCitationsOut(BaseModel):
    sentences: list[SentenceCitationOut]
    factual: int
    cited: int
    cited_share: float | None
    unsupported: int
    invalid: int = Field(description="Citations to facts the window was not given (dropped).")
    dropped: int
    written: int
    unplaced: int = Field(0, description="Refs by no factual sentence (a heading, code).")
    beyond: int = Field(0, description="Factual sentences past the 512 a window cites.")


class WindowResult(BaseModel):
    text: str | None = Field(None, description="A citing session's window text as shown, "
                             "its [F#] refs replaced by the document's numbers.")
    citations: WindowCitationsOut | None = None
    sources: list[CitationSource] | None = Field(
        None, description="The sources this window's numbers refer to.")
    session_id: str
    window: int
    report: DpeReportOut
    completeness: float
    residual: list[str]
    status: str
    done: bool
    exit_reason: str | None
    token: str
    headers: dict[str, str]


class Trace(BaseModel):
    """The trace of docs/design.md §4 "Contracts other code relies on", plus the session id and
    its progress."""

    model_config = ConfigDict(extra="allow")
    session_id: str
    task: str
    embedding_model: str
    ranking: str
    sub_queries: list[SubQueryOut]
    windows: list[dict[str, Any]]
    status: str
    completeness: float
    max_windows: int


class Deleted(BaseModel):
    id: str
    deleted: bool


# ------------------------------------------------------------------ CKF


class JobDocument(BaseModel):
    source: str
    doc_id: str | None
    facts: int
    status: str | None


class Job(BaseModel):
    id: str
    status: Literal["queued", "running", "succeeded", "failed"]
    files: list[str]
    created: float
    started: float | None = None
    finished: float | None = None
    report: dict[str, Any] | None = None
    documents: list[JobDocument] = Field(default_factory=list)
    error: str | None = None


class Health(BaseModel):
    status: str
    writer: str
    ckf: dict[str, Any] | None


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    message: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
