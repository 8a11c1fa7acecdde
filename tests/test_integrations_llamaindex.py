"""LlamaIndex integration with real LlamaIndex objects: a SummaryIndex retriever feeds Phase 1,
`CDRNodePostprocessor` reranks by CDR, and windows written by a real OpenAI-compatible server
on loopback (tests/chat_server.py) are recorded, so the next window's reranking moves on."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cdr.report import render_report
from tests.chat_server import ChatServer

if TYPE_CHECKING:
    from llama_index.core import SummaryIndex
    from llama_index.core.schema import MetadataMode, QueryBundle, TextNode

    from cdr.integrations.llamaindex import CDRNodePostprocessor


@pytest.fixture(scope="module", autouse=True)
def llama_index_imported() -> None:
    """Imports LlamaIndex (and skips every test when the extra is absent) when this module's
    first test runs, not when pytest collects it: importing `llama_index.core` costs about 2 s
    of CPU, and under `make test` each xdist worker collects every module while only one of
    them runs this one."""
    global SummaryIndex, MetadataMode, QueryBundle, TextNode, CDRNodePostprocessor
    pytest.importorskip("llama_index.core", reason="the llamaindex extra is not installed "
                        "(pip install 'cdr-retrieval[llamaindex]')")
    from llama_index.core import SummaryIndex
    from llama_index.core.schema import MetadataMode, QueryBundle, TextNode

    from cdr.integrations.llamaindex import CDRNodePostprocessor


TOPICS = ("truth", "typesseq", "typesmapping", "integers")
TASK = "Write a guide to Python's built-in types"
OUTLINE = ["Truth value testing", "Sequence types", "Mapping types dict"]


def documents() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics

    out = []
    for name in TOPICS:
        for i, para in enumerate(p.strip() for p in topics[name].split("\n\n")):
            if len(para.split()) >= 12:
                out.append((f"{name}.txt#{i}", para))
    return out


def facts_back(messages: list[dict[str, str]]) -> str:
    """The server's reply: the facts it was sent, as paragraphs (grounded text)."""
    return messages[-1]["content"].split("\n", 1)[1]


@pytest.fixture(scope="module")
def server():
    with ChatServer(reply=facts_back) as s:
        yield s


@pytest.fixture(scope="module")
def retriever(llama_index_imported: None):
    nodes = [TextNode(text=t, metadata={"source": n}) for n, t in documents()]
    return SummaryIndex(nodes).as_retriever()


def test_rerank_record_and_move_on(retriever):
    rerank = CDRNodePostprocessor.from_task(TASK, outline=OUTLINE, top_n=5, max_windows=3)
    first = rerank.postprocess_nodes(retriever.retrieve("built-in types"),
                                     query_bundle=QueryBundle("built-in types"))
    assert len(first) == 5
    scores = [n.score for n in first]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0
    meta = first[0].node.metadata
    assert {"cdr_relevance", "cdr_novelty", "cdr_residual_pull", "cdr_ngram_penalty"} <= set(meta)
    assert meta["cdr_window"] == 1 and meta["cdr_novelty"] == 1.0
    assert "cdr_novelty" not in first[0].node.get_content(metadata_mode=MetadataMode.LLM)
    record = rerank.record("\n\n".join(n.node.get_content() for n in first))
    assert record["number"] == 1 and record["completeness"] > 0
    assert len(record["attribution"]) == 5
    second = rerank.postprocess_nodes(retriever.retrieve("built-in types"),
                                      query_str="built-in types")
    assert second[0].node.metadata["cdr_window"] == 2
    first_ids = {n.node.node_id for n in first}
    # What was just written is covered: the best nodes now are others, and any repeat pays
    # the n-gram penalty.
    assert {n.node.node_id for n in second} != first_ids
    for n in second:
        if n.node.node_id in first_ids:
            assert n.node.metadata["cdr_ngram_penalty"] > 0
    with pytest.raises(Exception, match="no reranked nodes"):
        rerank.record("x")
        rerank.record("y")


def test_async_and_trace_renders(retriever):
    rerank = CDRNodePostprocessor.from_task(TASK, outline=OUTLINE, top_n=4, max_windows=2)

    async def drive() -> int:
        n = 0
        while not rerank.done:
            nodes = await retriever.aretrieve("built-in types")
            ranked = await rerank.apostprocess_nodes(nodes, query_str="built-in types")
            await rerank.arecord("\n\n".join(x.node.get_content() for x in ranked))
            n += 1
        return n

    assert asyncio.run(drive()) == 2
    trace = rerank.trace()
    assert trace["status"] == "limit-reached" and len(trace["windows"]) == 2
    html = render_report([trace])
    assert 'id="w2"' in html and "typesseq.txt#" in html
    with pytest.raises(Exception, match="has ended"):
        rerank.record("more")


def test_docs_llamaindex_example_runs(server):
    server.reset()
    server.reply = facts_back
    page = (Path(__file__).resolve().parents[1] / "docs" / "integrations.md").read_text(
        encoding="utf-8")
    block = re.search(r"## LlamaIndex\n.*?```python\n(.*?)```", page, re.S).group(1)
    code = block.replace("print(", "seen.append((")
    code = re.sub(r"seen\.append\(\((.*)\)$", r"seen.append((\1,))", code, flags=re.M)
    seen: list = []
    # The snippet's free names, as its comment says: documents and an OpenAI-compatible server.
    names = {"seen": seen, "my_documents": documents(), "BASE_URL": server.openai_base_url,
             "API_KEY": "sk-local", "MODEL": "my-model"}
    exec(compile(code, "docs/integrations.md", "exec"), names)
    assert seen[0][0] in ("task-complete", "limit-reached", "ckf-exhausted")
    assert 1 <= len(server.requests) <= 5


def test_record_cites_the_text_against_the_windows_nodes(retriever):
    rerank = CDRNodePostprocessor.from_task(TASK, outline=OUTLINE, top_n=4, max_windows=3)
    first = rerank.postprocess_nodes(retriever.retrieve("built-in types"),
                                     query_bundle=QueryBundle("built-in types"))
    written = "\n\n".join(n.node.get_content() for n in first[:2])
    record = rerank.record(written + "\n\nCats like to sleep in the warm sun all day long.")
    cit = record["citations"]
    assert cit["cited"] >= 1 and cit["unsupported"] >= 1
    ids = {n.node.node_id for n in first}
    assert all(set(s["facts"]) <= ids for s in cit["sentences"])
    assert "[1]" in record["text"] and "[1]" not in record["output"]
    cited = rerank.source_nodes()
    assert [n.node.metadata["cdr_citation"] for n in cited] == list(range(1, len(cited) + 1))
    assert {n.node.node_id for n in cited} <= {n.node.node_id for n in first[:2]}
    assert [s["number"] for s in rerank.trace()["sources"]] == list(range(1, len(cited) + 1))
    off = CDRNodePostprocessor.from_task(TASK, outline=OUTLINE, top_n=4, max_windows=3,
                                         citations="off")
    nodes = off.postprocess_nodes(retriever.retrieve("built-in types"),
                                  query_bundle=QueryBundle("built-in types"))
    plain = off.record("\n\n".join(n.node.get_content() for n in nodes))
    assert "citations" not in plain and "text" not in plain and off.source_nodes() == []
    assert "cited_sources" not in off.session.to_dict() and "sources" not in off.trace()


def _nodes_with(embedding_of) -> list:
    from llama_index.core.schema import NodeWithScore

    docs = documents()
    vectors = embedding_of([t for _, t in docs])
    return [NodeWithScore(node=TextNode(text=t, metadata={"source": n}, embedding=list(v)),
                          score=1.0) for (n, t), v in zip(docs, vectors, strict=True)]


def test_the_nodes_own_embeddings_are_used_once_they_are_the_sessions_models() -> None:
    """Nodes a vector store returns with the session model's embeddings: a sample of them is
    embedded again to check, the rest are used as they are, and the ranking is the one of
    embedding every node. Nodes embedded by another model are all embedded again."""
    import numpy as np

    from cdr.retrieval.embed import default_embedder

    emb = default_embedder()
    own = _nodes_with(emb.encode)
    plain = [type(n)(node=TextNode(text=n.node.text, metadata=dict(n.node.metadata)),
                     score=1.0) for n in own]
    rng = np.random.default_rng(0)
    other = _nodes_with(lambda texts: rng.normal(size=(len(texts), emb.dim)))

    def ranked(nodes: list) -> tuple[list[str], int]:
        rerank = CDRNodePostprocessor.from_task(TASK, outline=OUTLINE, top_n=5, max_windows=3)
        out = rerank.postprocess_nodes(nodes, query_str="built-in types")
        return [n.node.text for n in out], rerank.embedded_texts

    got_plain, embedded_plain = ranked(plain)
    got_own, embedded_own = ranked(own)
    got_other, embedded_other = ranked(other)
    assert embedded_plain == len({n.node.text for n in plain}) > 8
    assert embedded_own == 8  # the identity sample only
    assert got_own == got_plain == got_other
    assert embedded_other == embedded_plain + 8  # checked, refused, then all embedded
