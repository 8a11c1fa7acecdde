"""LangChain integration (`pip install 'cdr-retrieval[langchain]'`, needs `langchain-core`).

Three pieces, each following LangChain's conventions:

* `CDRRetriever` — a `BaseRetriever` bound to one CDR session. Each call returns the *next
  window's* envelope as `Document`s (score components in `metadata`); `record(text)` tells
  the session what the model wrote from them, so the next call moves on to what is not yet
  covered. Calls before `record` return the same envelope again (like the gateway's sidecar).
* `LangChainWriter` — a cdr `Writer` backed by any LangChain chat model, so the cdr loop
  (`cdr.Generator`) can use it like its own writers.
* `CDRLoop` — a `Runnable` that drives the whole multi-window loop with a chat model as the
  writer: `CDRLoop(ckf, llm).invoke("Write a guide to X")` returns the document, the status
  and the trace (`ainvoke` awaits the model's `ainvoke`).

A vector store a LangChain app already filled is a knowledge base too, its vectors as they are
(`index_from_vectorstore`, `CDRRetriever.from_vectorstore`, `CDRLoop(vectorstore, llm)`):
`InMemoryVectorStore` and a Qdrant-backed store (`langchain-qdrant`'s `QdrantVectorStore`, read
through its client) are read; the vectors' model is checked on the store itself
(`cdr.stores.collection`).

Why the retriever ignores its query after the first call: CDR ranks against the session's
task (its composite query vector, docs/design.md §3.11 "The query and the gate"), not against each
call's text; the first call's query starts the session when none was given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForRetrieverRun,
        CallbackManagerForRetrieverRun,
    )
    from langchain_core.documents import Document
    from langchain_core.messages import BaseMessage, convert_to_messages
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables import Runnable, RunnableConfig
    from pydantic import ConfigDict, PrivateAttr
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "cdr.integrations.langchain needs langchain-core: pip install 'cdr-retrieval[langchain]'"
    ) from exc

from cdr.errors import InvalidInputError, UpstreamError
from cdr.integrations.windows import envelope_facts
from cdr.session import Session
from cdr.trace import build_trace
from cdr.window.loop import GenerationConfig, Generator, PreparedWindow, WindowEvent
from cdr.writers.base import DeltaCallback, WriterResult

__all__ = ["CDRLoop", "CDRRetriever", "LangChainWriter", "envelope_documents",
           "source_documents"]

def envelope_documents(prepared: PreparedWindow) -> list[Document]:
    """A prepared window's facts as Documents, in envelope order. `metadata` holds `source`
    (LangChain's usual key), `section`, `fact_id`, `ref` (F1, F2 … as the prompt cites them),
    `window`, `tokens` and the CDR score components (`cdr.integrations.windows`)."""
    return [Document(page_content=text, metadata=meta, id=fid)
            for fid, text, meta in envelope_facts(prepared)]


def source_documents(session: Session, events: Sequence[WindowEvent]) -> list[Document]:
    """A citing run's sources (`citations` on) as Documents, in number order: each the
    whole cited fact, its `metadata` holding `number` (the document's marker), `fact_id`,
    `source`, `section` and `title`. Empty for a run that does not cite."""
    texts = {fid: fact.content for e in events
             for fid, fact in zip(e.prepared.envelope.fact_ids, e.prepared.facts, strict=True)}
    return [Document(page_content=texts.get(s.fact_id, s.excerpt), id=s.fact_id,
                     metadata={"number": s.number, "fact_id": s.fact_id, "source": s.source,
                               "section": s.section, "title": s.title})
            for s in session.cited_sources]


def _index(kb: Any) -> Any:
    """A CKF directory opened; a `cdr.CKF` or any fact index as it is; a LangChain vector
    store read (`index_from_vectorstore`)."""
    import os

    from cdr.ckf import CKF

    if isinstance(kb, str | os.PathLike):
        return CKF.open(kb)
    if hasattr(kb, "similarity_search") and not hasattr(kb, "select"):
        return index_from_vectorstore(kb)
    return kb


def index_from_vectorstore(store: Any, *, model: str = "minilm") -> Any:
    """The facts of a LangChain vector store with their stored vectors, as a fact index:
    `InMemoryVectorStore` (its `store` of id → text, vector, metadata) or a store over a Qdrant
    client (`client` and `collection_name`, LangChain's `page_content` / `metadata` payload).
    `model` names the embedder that made the vectors (an `--embedder` spec), checked on the
    store; a store of another kind is refused, naming the kinds read."""
    from cdr.stores.collection import collection_index

    name = type(store).__name__
    raw = getattr(store, "store", None)
    if isinstance(raw, Mapping):
        items = [v for v in raw.values() if isinstance(v, Mapping)]
        texts, vectors, sources, sections = [], [], [], []
        skipped: dict[str, int] = {}
        for item in items:
            text, vector = item.get("text"), item.get("vector")
            if not isinstance(text, str) or not text.strip() or vector is None:
                skipped["no text or no vector"] = skipped.get("no text or no vector", 0) + 1
                continue
            meta = item.get("metadata") or {}
            texts.append(text)
            vectors.append(vector)
            sources.append(str(meta.get("source") or name))
            sections.append(str(meta.get("section") or meta.get("title") or ""))
        return collection_index(vectors, texts, sources, sections, model=model,
                                where=f"LangChain {name}", skipped=skipped)
    client, collection = getattr(store, "client", None), getattr(store, "collection_name", None)
    if client is not None and type(client).__name__ == "QdrantClient" and collection:
        from cdr.retrieval.embed import get_embedder
        from cdr.stores.qdrant import QdrantAddress, read_points

        addr = QdrantAddress(None, None, str(collection), None, model, None,
                             shown=f"LangChain {name} {collection}")
        pts = read_points(client, addr, int(get_embedder(model).dim))
        return collection_index(pts.vectors, pts.texts, pts.sources, pts.sections,
                                model=model, where=addr.shown, skipped=pts.skipped)
    raise InvalidInputError(
        f"cannot read the vectors of a LangChain {name}: InMemoryVectorStore and stores over "
        "a Qdrant client are read; for another store, ingest its documents with `cdr ingest`")


class CDRRetriever(BaseRetriever):
    """A retriever bound to one CDR session; see the module docstring.

    Build it with `CDRRetriever.from_ckf(ckf, task=...)` or from a `cdr.Generator`. Not safe
    for concurrent calls on one instance (a session moves one window at a time)."""

    generator: Any
    session: Any = None
    task: str | None = None
    outline: str | None = None

    model_config = ConfigDict(arbitrary_types_allowed=True)
    _prepared: PreparedWindow | None = PrivateAttr(default=None)
    _events: list[WindowEvent] = PrivateAttr(default_factory=list)

    @classmethod
    def from_ckf(cls, ckf: Any, *, task: str | None = None, outline: str | None = None,
                 config: GenerationConfig | None = None) -> CDRRetriever:
        """`ckf` is a `cdr.CKF`, a CKF directory, any fact index or a LangChain vector store
        (`index_from_vectorstore`)."""
        from cdr.writers.extractive import ExtractiveWriter

        return cls(generator=Generator(_index(ckf), ExtractiveWriter(), config),
                   task=task, outline=outline)

    @classmethod
    def from_vectorstore(cls, store: Any, *, model: str = "minilm", task: str | None = None,
                         outline: str | None = None, config: GenerationConfig | None = None
                         ) -> CDRRetriever:
        """A retriever over the facts of a LangChain vector store and their stored vectors
        (`index_from_vectorstore`; `model` names the embedder that made them)."""
        return cls.from_ckf(index_from_vectorstore(store, model=model), task=task,
                            outline=outline, config=config)

    # -- state ----------------------------------------------------------------------------

    @property
    def events(self) -> list[WindowEvent]:
        """One event per window recorded so far."""
        return list(self._events)

    @property
    def done(self) -> bool:
        """True once an exit rule has fired: further calls return no documents."""
        return self.session is not None and self.session.status != "in-progress"

    def _session(self, query: str) -> Session:
        if self.session is None:
            task = self.task or query
            if not task or not task.strip():
                raise InvalidInputError("no task: pass task= or a non-empty query")
            self.session = self.generator.start(task, self.outline)
        out: Session = self.session
        return out

    def prepared(self) -> PreparedWindow | None:
        """The envelope handed out and not yet recorded, if any."""
        return self._prepared

    # -- retrieval ------------------------------------------------------------------------

    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        session = self._session(query)
        if self.done:
            return []
        if self._prepared is None:
            self._prepared = self.generator.prepare(session)
            if len(self._prepared.envelope) == 0:
                # Nothing relevant and novel is left: end the session here (Exit 3).
                self._record("")
                return []
        return envelope_documents(self._prepared)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        return await asyncio.to_thread(self._get_relevant_documents, query,
                                       run_manager=run_manager.get_sync())

    # -- recording ------------------------------------------------------------------------

    def _record(self, text: str) -> WindowEvent:
        if self._prepared is None:
            raise InvalidInputError("no envelope is out: call the retriever (invoke) before "
                                    "recording what the model wrote")
        event = self.generator.complete(self.session, self._prepared, text)
        self._prepared = None
        self._events.append(event)
        out: WindowEvent = event
        return out

    def record(self, text: str | BaseMessage) -> WindowEvent:
        """Record what the model wrote from the last envelope: DPE Stage 8 verifies it, the
        session's coverage, residual set and n-gram blacklist move on, and the exit rules run
        (`event.done`). Accepts the text or the model's message."""
        return self._record(_text(text))

    async def arecord(self, text: str | BaseMessage) -> WindowEvent:
        return await asyncio.to_thread(self.record, text)

    def messages(self) -> list[BaseMessage]:
        """The prompt cdr built for the envelope that is out (system + user, with the
        Residual Task Anchor and the section plan), as LangChain messages."""
        if self._prepared is None:
            raise InvalidInputError("no envelope is out: call the retriever first")
        return convert_to_messages(self._prepared.messages)

    def trace(self) -> dict[str, Any]:
        """The run's trace (docs/design.md §4 "Contracts other code relies on"), for `cdr report` or
        `cdr.report.render_report`."""
        if self.session is None:
            raise InvalidInputError("the session has not started yet")
        return build_trace(self.session, self._events)


def _text(message: Any) -> str:
    if isinstance(message, str):
        return message
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # content blocks
        return "".join(b.get("text", "") if isinstance(b, Mapping) else str(b)
                       for b in content)
    raise InvalidInputError(f"cannot read text from {type(message).__name__}")


def _result(message: Any) -> WriterResult:
    meta = getattr(message, "response_metadata", None) or {}
    usage_meta = getattr(message, "usage_metadata", None) or {}
    usage = {}
    if usage_meta:
        usage = {"prompt_tokens": int(usage_meta.get("input_tokens", 0)),
                 "completion_tokens": int(usage_meta.get("output_tokens", 0)),
                 "total_tokens": int(usage_meta.get("total_tokens", 0))}
    finish = str(meta.get("finish_reason") or meta.get("stop_reason") or "stop")
    return WriterResult(_text(message), finish, usage)


class LangChainWriter:
    """A cdr `Writer` backed by a LangChain chat model (anything whose `invoke` takes a list
    of messages and returns a message). `max_tokens_arg` names the call keyword that caps the
    reply (`max_tokens` for ChatOpenAI and ChatAnthropic); None sends no cap."""

    name = "langchain"
    pastes_facts = False  # a model writes
    needs_model = False  # the chat model object names its own model

    def __init__(self, llm: Any, *, max_tokens_arg: str | None = "max_tokens") -> None:
        self.llm = llm
        self.max_tokens_arg = max_tokens_arg

    def _kwargs(self, max_tokens: int) -> dict[str, Any]:
        return {self.max_tokens_arg: max_tokens} if self.max_tokens_arg else {}

    def generate(self, messages: list[dict[str, str]], max_tokens: int, *,
                 on_delta: DeltaCallback | None = None) -> WriterResult:
        try:
            reply = self.llm.invoke(convert_to_messages(messages), **self._kwargs(max_tokens))
        except Exception as exc:  # the model's own errors vary by provider
            raise UpstreamError(f"the LangChain model failed: {exc}", None) from exc
        result = _result(reply)
        if on_delta is not None and result.text:
            on_delta(result.text)
        return result

    async def agenerate(self, messages: list[dict[str, str]], max_tokens: int) -> WriterResult:
        try:
            reply = await self.llm.ainvoke(convert_to_messages(messages),
                                           **self._kwargs(max_tokens))
        except Exception as exc:
            raise UpstreamError(f"the LangChain model failed: {exc}", None) from exc
        return _result(reply)


def _task_input(value: Any) -> tuple[str, str | None]:
    if isinstance(value, str):
        return value, None
    if isinstance(value, Mapping) and isinstance(value.get("task"), str):
        outline = value.get("outline")
        if isinstance(outline, list | tuple):
            outline = "\n".join(str(x) for x in outline)
        return value["task"], outline
    raise InvalidInputError("CDRLoop input must be the task (a string) or {'task': ..., "
                            "'outline': ...}")


class CDRLoop(Runnable[Any, dict[str, Any]]):
    """The whole multi-window loop as a runnable: task in, document out, a LangChain chat
    model writing every window. Output: `document` (the windows merged, Markdown), `status`
    (the exit reason), `windows` (how many), `trace` (docs/design.md §4 "Contracts other
    code relies on") and `sources` (with `citations` on, the cited facts as Documents:
    `source_documents`)."""

    def __init__(self, ckf: Any, llm: Any, config: GenerationConfig | None = None, *,
                 max_tokens_arg: str | None = "max_tokens") -> None:
        self.ckf = _index(ckf)  # a CKF, its directory, a fact index or a LangChain store
        self.writer = LangChainWriter(llm, max_tokens_arg=max_tokens_arg)
        self.config = config or GenerationConfig()

    def _generator(self) -> Generator:
        return Generator(self.ckf, self.writer, self.config)

    @staticmethod
    def _output(session: Session, events: list[WindowEvent]) -> dict[str, Any]:
        from cdr.window.cite import document_of

        document = document_of(session, events, [sq.text for sq in session.sub_queries])
        return {"document": document, "status": session.status, "windows": len(events),
                "trace": build_trace(session, events),
                "sources": source_documents(session, events)}

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
               ) -> dict[str, Any]:
        task, outline = _task_input(input)
        gen = self._generator()
        session = gen.start(task, outline)
        events = list(gen.run(task, session=session))
        return self._output(session, events)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
                      ) -> dict[str, Any]:
        task, outline = _task_input(input)
        gen = self._generator()
        session = await asyncio.to_thread(gen.start, task, outline)
        events: list[WindowEvent] = []
        error: UpstreamError | None
        while True:
            prepared = await asyncio.to_thread(gen.prepare, session)
            if len(prepared.envelope) == 0:
                events.append(gen.complete(session, prepared, ""))
                break
            try:
                result = await self.writer.agenerate(prepared.messages, prepared.max_tokens)
                text, error = result.text, None
            except UpstreamError as exc:
                result, text, error = None, "", exc
            event = await asyncio.to_thread(gen.complete, session, prepared, text,
                                            result=result, error=error)
            events.append(event)
            if event.done:
                break
        return self._output(session, events)
