"""LlamaIndex integration (`pip install 'cdr-retrieval[llamaindex]'`, needs `llama-index-core`).

`CDRNodePostprocessor` reranks the nodes any LlamaIndex retriever returns by CDR for one
session: the retriever (vector store, BM25, a router…) does Phase 1, and CDR's Phase 2 scores
them by relevance to the task × novelty against what the session already covered × the
n-gram guard, with the residual pull toward sub-queries not yet written. `record(text)` tells
the session what the model wrote from them (DPE Stage 8), so the next window's reranking
moves on; `trace()` gives a trace for `cdr report`.

Coverage and relevance must be measured in one embedding space (SPEC-024 §2.5), and a node's
stored embedding may come from another model. So a node's own `embedding` is used only once
the nodes' embeddings are shown to be the session's model's: a sample of each batch's new
ones (`cdr.stores.collection.verify_identity`) is embedded again and must match. Nodes
without an embedding, or whose embeddings failed that check once, are embedded with cdr's
embedder (`embedded_texts` counts what was embedded).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

try:
    from llama_index.core.bridge.pydantic import Field, PrivateAttr
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "cdr.integrations.llamaindex needs llama-index-core: "
        "pip install 'cdr-retrieval[llamaindex]'"
    ) from exc

import numpy as np

from cdr.citations import Citer, GivenFact
from cdr.coverage import SubQuery
from cdr.errors import InvalidInputError
from cdr.ngrams import ngram_hashes
from cdr.options import SessionOptions
from cdr.ranking import Ranking, rank
from cdr.retrieval.subject import task_topic
from cdr.session import IN_PROGRESS, Session
from cdr.text.tokens import count_tokens
from cdr.vectors import normalize
from cdr.window.cite import CitedText, cite_text, record_sources
from cdr.window.dpe import (
    DEFAULT_ATTRIBUTION_THRESHOLD,
    parse_outline,
    split_paragraphs,
    verify_window,
)
from cdr.window.headers import decimal2

__all__ = ["CDRNodePostprocessor"]

SCORE_KEYS = ("relevance", "novelty", "residual_pull", "ngram_penalty")


class CDRNodePostprocessor(BaseNodePostprocessor):
    """Rerank retrieved nodes by CDR for one session; record each window written from them.

    Build with `CDRNodePostprocessor.from_task(task, outline=...)`. Each node's `score`
    becomes its CDR score and its metadata gains `cdr_relevance`, `cdr_novelty`,
    `cdr_residual_pull`, `cdr_ngram_penalty` and `cdr_window` (kept out of the text the LLM
    and the embedder see). Not safe to share between concurrent sessions: one instance is
    one session."""

    top_n: int = Field(default=8, description="Nodes kept per window, best CDR score first.")
    min_relevance: float | None = Field(
        default=None, description="Drop nodes below this relevance to the task; None keeps "
        "what the retriever returned (it already did Phase 1).")

    _session: Any = PrivateAttr(default=None)
    _embedder: Any = PrivateAttr(default=None)
    _last: Any = PrivateAttr(default=None)  # (nodes, ranking, tokens) handed out last
    _windows: list[Any] = PrivateAttr(default_factory=list)
    _vectors: dict[str, Any] = PrivateAttr(default_factory=dict)  # text -> unit vector
    _stored_ok: bool | None = PrivateAttr(default=None)  # the nodes' own embeddings usable?
    _embedded: int = PrivateAttr(default=0)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)
    _cited: dict[str, Any] = PrivateAttr(default_factory=dict)  # node id -> cited node

    @classmethod
    def class_name(cls) -> str:
        return "CDRNodePostprocessor"

    @classmethod
    def from_task(cls, task: str, *, outline: str | Sequence[str] | None = None,
                  embedder: Any = None, words: int = 1800, max_windows: int = 5,
                  ranking: str = "cdr", top_n: int = 8,
                  min_relevance: float | None = None, citations: str = "numbers"
                  ) -> CDRNodePostprocessor:
        """A postprocessor with a fresh session for `task`. `outline`: one sub-query per
        line (or a list); without one, the task is its own single sub-query. `embedder`:
        a cdr `Embedder` (default: cdr's offline model). `citations`: how `record` cites the
        text against the window's nodes — numbers ([n]), footnotes ([^n]) or off — a session
        option like the loop's (`cdr.citations`)."""
        if embedder is None:
            from cdr.retrieval.embed import default_embedder

            embedder = default_embedder()
        if isinstance(outline, str | type(None)):
            text = outline
        else:
            text = "\n".join(str(x) for x in outline)
        sqs = parse_outline(text, words) if text else [SubQuery("sq-1", task_topic(task),
                                                                words)]
        vecs = embedder.encode([task_topic(task)] + [sq.text for sq in sqs])
        query = normalize(vecs[0] + normalize(vecs[1:].mean(axis=0), "centroid"), "query")
        session = Session.start(task, sqs, vecs[1:], query, embedder.model_id,
                                max_windows=max_windows, ranking=ranking,
                                min_relevance=-1.0 if min_relevance is None else min_relevance,
                                options=SessionOptions(citations=citations))
        self = cls(top_n=top_n, min_relevance=min_relevance)
        self._session = session
        self._embedder = embedder
        return self

    @property
    def session(self) -> Session:
        if self._session is None:
            raise InvalidInputError("no CDR session: build with CDRNodePostprocessor.from_task")
        out: Session = self._session
        return out

    @property
    def done(self) -> bool:
        return self.session.status != IN_PROGRESS

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        session = self.session
        if not nodes or self.done:
            return []
        texts = [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes]
        emb = self._embed(texts, [getattr(n.node, "embedding", None) for n in nodes])
        relevance = emb @ session.query_vector
        counts = np.array([sum(1 for h in ngram_hashes(t).tolist() if h in session.blacklist)
                           for t in texts], dtype=np.int32)
        importance = np.array([float(n.node.metadata.get("importance", 1.0)) for n in nodes],
                              dtype=np.float32)
        ranked: Ranking = rank(emb, relevance, importance=importance, ngram_counts=counts,
                               coverage=session.coverage, residual=session.residual,
                               mode=session.ranking, min_relevance=session.min_relevance,
                               top_k=self.top_n)
        out = []
        for j, i in enumerate(ranked.indices.tolist()):
            src = nodes[i].node
            meta = {f"cdr_{k}": round(float(getattr(ranked, k)[j]), 4) for k in SCORE_KEYS}
            meta["cdr_window"] = session.window_count + 1
            src.metadata.update(meta)
            for key in (*meta,):
                if key not in src.excluded_llm_metadata_keys:
                    src.excluded_llm_metadata_keys.append(key)
                if key not in src.excluded_embed_metadata_keys:
                    src.excluded_embed_metadata_keys.append(key)
            out.append(NodeWithScore(node=src, score=float(ranked.score[j])))
        with self._lock:
            self._last = (out, ranked, [count_tokens(texts[i]) for i in ranked.indices])
        return out

    @property
    def embedded_texts(self) -> int:
        """How many texts this session embedded itself (identity samples included)."""
        return self._embedded

    def _embed(self, texts: list[str], stored: Sequence[Any] | None = None) -> np.ndarray:
        """Embeddings by text, cached for the session: a retriever returns many of the same
        nodes every window, and embedding is the costly step. `stored`: the nodes' own
        embeddings (None where a node has none), used once checked (see the module doc)."""
        new = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        if new and stored is not None and self._stored_ok is not False:
            self._take_stored([(t, e) for t, e in zip(texts, stored, strict=True) if t in new])
            new = [t for t in new if t not in self._vectors]
        if new:
            self._embedded += len(new)
            for t, v in zip(new, self._embedder.encode(new), strict=True):
                self._vectors[t] = v
        return np.stack([self._vectors[t] for t in texts]) if texts else np.zeros(
            (0, self.session.dim), np.float32)

    def _take_stored(self, pairs: list[tuple[str, Any]]) -> None:
        """Cache the nodes' own embeddings of `pairs` once a sample of them passes the
        identity check; a failed check turns them off for the session."""
        from cdr.errors import InvalidInputError
        from cdr.stores.collection import VERIFY_SAMPLE, verify_identity

        own: dict[str, np.ndarray] = {}
        for t, e in pairs:
            v = None if e is None else np.asarray(e, dtype=np.float32).ravel()
            if v is not None and v.shape == (self.session.dim,) and np.isfinite(v).all() \
                    and np.any(v):
                own.setdefault(t, v / np.linalg.norm(v))
        if not own:
            return
        texts = list(own)
        vectors = np.vstack([own[t] for t in texts])
        try:
            verify_identity("the nodes' embeddings", self._embedder, vectors, texts)
        except InvalidInputError:
            self._stored_ok = False
            return
        finally:
            self._embedded += min(VERIFY_SAMPLE, len(texts))
        self._stored_ok = True
        self._vectors.update(zip(texts, vectors, strict=True))

    async def _apostprocess_nodes(self, nodes: list[NodeWithScore],
                                  query_bundle: QueryBundle | None = None
                                  ) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._postprocess_nodes, nodes, query_bundle)

    def record(self, text: str, *, threshold: float = DEFAULT_ATTRIBUTION_THRESHOLD
               ) -> dict[str, Any]:
        """Record the window the LLM wrote from the last reranked nodes: Stage 8 attributes
        its paragraphs to sub-queries, the session's coverage, residual set and n-gram
        blacklist move on, and the exit rules run. Returns the window's trace record."""
        session = self.session
        if self.done:
            raise InvalidInputError(f"the session has ended ({session.status})")
        with self._lock:
            last, self._last = self._last, None
        if last is None:
            raise InvalidInputError("no reranked nodes to record a window for: run a query "
                                    "through the postprocessor first")
        nodes, ranked, tokens = last
        cited = self._cite(nodes, text)
        if cited is not None:
            text = cited.clean
        paragraphs = split_paragraphs(text)
        emb = (self._embedder.encode([p for _, p in paragraphs]) if paragraphs
               else np.zeros((0, session.dim), np.float32))
        fresh = [session.blacklist.fresh_share(p) for _, p in paragraphs]
        report = verify_window(session.sub_queries, session.sub_query_embeddings, emb,
                               paragraphs, threshold, fresh)
        coverage_depth = len(session.coverage)
        session.update_after_window(report.addressed, text,
                                    embedding_model_id=self._embedder.model_id)
        ratios = ranked.novelty_ratio() if len(ranked) else np.zeros(0)
        mean_ratio = float(ratios.mean()) if len(ratios) else None
        session.status = session.exit_reason(mean_ratio) or IN_PROGRESS
        record = {
            "number": session.window_count,
            "envelope": [
                {"fact_id": n.node.node_id,
                 "source": _node_source(n),
                 "section": str(n.node.metadata.get("section", "")),
                 **{k: n.node.metadata[f"cdr_{k}"] for k in SCORE_KEYS},
                 "score": round(float(n.score or 0.0), 4), "tokens": max(int(t), 1)}
                for n, t in zip(nodes, tokens, strict=True)],
            "output": text, "addressed": report.addressed_sub_queries,
            "completeness": round(session.completeness(), 4),
            "residual": list(session.residual_ids),
            "headers": {
                "CRP-Context-Coverage-Score": decimal2(float(ratios.min()) if len(ratios)
                                                       else 0.0),
                "CRP-Context-Coverage-Depth": str(coverage_depth),
                "CRP-Context-NGram-Guard-Activations": str(ranked.ngram_activations),
                "CRP-Context-Continuation-Status": session.status,
                "CRP-Quality-Completeness": decimal2(session.completeness()),
            },
            "attribution": list(report.attribution),
        }
        if cited is None:
            self._windows.append(record)
            return record
        record["citations"] = cited.citations.to_dict()
        self._windows.append(record)
        return {**record, "text": cited.shown}

    def _cite(self, nodes: list[NodeWithScore], text: str) -> CitedText | None:
        """`text` cited against the window's nodes (F1… in their reranked order, as a prompt
        that numbered them would cite them), numbered on from the session's sources."""
        style = self.session.options.citations
        if style == "off" or not nodes:
            return None
        contents = [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes]
        given = [GivenFact(f"F{j + 1}", n.node.node_id, _node_source(n),
                           str(n.node.metadata.get("section", "")), c)
                 for j, (n, c) in enumerate(zip(nodes, contents, strict=True))]
        citer = Citer(given, self._embed(contents), self._embedder.encode)
        cited = cite_text(self.session, citer, text)
        record_sources(self.session, cited)
        for n in nodes:
            if n.node.node_id in cited.citations.numbers:
                self._cited.setdefault(n.node.node_id, n)
        return cited

    def source_nodes(self) -> list[NodeWithScore]:
        """The nodes the recorded windows cite, in number order (the text's [n] is item
        n-1), each with `cdr_citation` (its number) in its metadata."""
        out = []
        for entry in self.session.cited_sources:
            node = self._cited.get(entry.fact_id)
            if node is not None:
                node.node.metadata["cdr_citation"] = entry.number
                out.append(node)
        return out

    async def arecord(self, text: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.record, text)

    def trace(self) -> dict[str, Any]:
        """The session's trace (docs/design.md §4 "Contracts other code relies on"), for `cdr
        report`."""
        s = self.session
        return {"task": s.task, "embedding_model": s.model_id, "ranking": s.ranking,
                "sub_queries": [{"id": q.id, "text": q.text, "expected_words": q.expected_words}
                                for q in s.sub_queries],
                "windows": list(self._windows), "status": s.status,
                **({"sources": [e.to_dict() for e in s.cited_sources]}
                   if s.cited_sources else {})}


def _node_source(node: NodeWithScore) -> str:
    """A node's source as a trace names it: its file, else its `source`, else its id."""
    meta = node.node.metadata
    return str(meta.get("file_name") or meta.get("source") or node.node.node_id)
