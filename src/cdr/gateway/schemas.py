"""Request and response bodies (they are also the OpenAPI schema the fuzz tests run from).

Bounds on sizes are part of the contract: they keep one request's cost (embedding, packing)
bounded, and make the schema honest about what the gateway accepts.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from cdr.gateway.limits import check_text
from cdr.options import (
    DocumentsMode,
    EnvelopeMode,
    LengthMode,
    LexicalMode,
    MemoryMode,
    ProfileName,
    QueriesMode,
    RepeatsMode,
    StaleMode,
    SubjectMode,
)
from cdr.ranking import RankingMode
from cdr.session import MAX_WINDOWS_LIMIT

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


class GenerationOptions(_Strict):
    """How to run the window loop; every field is optional (server defaults apply)."""

    outline: str | list[str] | None = Field(
        None, description="Sub-queries: a Markdown/plain outline (one per line) or a list. "
        "Omitted: decomposed automatically (by the LLM writer, else from the CKF).")
    max_windows: int | None = Field(None, ge=1, le=MAX_WINDOWS_LIMIT,
                                    description="Window limit (Exit 2).")
    words: int | None = Field(None, ge=1, le=MAX_WORDS, description="Target document length.")
    ranking: RankingMode | None = Field(None, description="Phase 2 ranking mode.")
    sub_queries: int | None = Field(None, ge=1, le=MAX_SUB_QUERIES,
                                    description="Sub-queries for automatic decomposition.")
    window_tokens: int | None = Field(None, ge=16, le=32_768, description="Generation reserve "
                                      "G: the most tokens one window may write (the LLM's "
                                      "max_tokens per window).")
    context_tokens: int | None = Field(None, ge=256, le=2_000_000, description="Context size "
                                       "C of the LLM that writes the windows; the envelope "
                                       "gets C minus system prompt, task, anchor and G.")
    # Opt-in options beyond the spec (cdr.options), fixed into the session at its start.
    profile: ProfileName | None = Field(None, description="Preset: 'spec' (default), "
                                        "'fresh' (fact memory, fitted envelopes, expanded "
                                        "sub-queries) or 'focused' (fact memory, BM25 "
                                        "fused relevance, document support, a stop on "
                                        "stale envelopes and the length contract); "
                                        "single options override it.")
    memory: MemoryMode | None = Field(None, description="'facts': facts already shown or "
                                      "written lose score in later windows.")
    envelope: EnvelopeMode | None = Field(None, description="'fit': pack as many facts as "
                                          "the window's planned words can use.")
    queries: QueriesMode | None = Field(None, description="'expanded': sub-queries expanded "
                                        "from the CKF at session start.")
    repeats: RepeatsMode | None = Field(None, description="'drop': sentences, list items and "
                                        "code an earlier window already wrote (same words or "
                                        "same meaning) are taken out of each window.")
    subject: SubjectMode | None = Field(None, description="'anchor': each sub-query is "
                                        "embedded as the task's subject plus its line.")
    lexical: LexicalMode | None = Field(None, description="'bm25': relevance fuses the "
                                        "cosine with BM25 over the task's words.")
    stale: StaleMode | None = Field(None, description="'stop': a window whose envelope is "
                                    "mostly facts already sent ends the run (ckf-exhausted) "
                                    "unwritten.")
    length: LengthMode | None = Field(None, description="'contract': each window is planned "
                                      "for the words still owed, a section is written once "
                                      "(continued only where it was cut), and the run ends "
                                      "task-complete once `words` is delivered within ±15%.")
    documents: DocumentsMode | None = Field(None, description="'support': each fact's "
                                            "relevance is weighed by how well its document "
                                            "matches the task against the best-matching "
                                            "document.")

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
    """OpenAI's request. Sampling fields (`temperature`, `max_tokens`...) are accepted and
    ignored: each window's budget comes from the envelope (SPEC-003), not from the client."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str = Field("cdr", max_length=256)
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
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


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


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


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage
    crp: CrpResult


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


class AddressedOut(BaseModel):
    id: str
    depth: float


class DpeReportOut(BaseModel):
    addressed: list[AddressedOut]
    words: dict[str, int]
    paragraphs: int
    unattributed_words: int


class WindowResult(BaseModel):
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
