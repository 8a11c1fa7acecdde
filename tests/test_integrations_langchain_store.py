"""A LangChain vector store as the knowledge base (`cdr.integrations.langchain.
index_from_vectorstore`): the store's own vectors, checked against the model, ranked as a CKF
of the same facts ranks them; a store of another model or kind refused with a message."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest

from cdr.ckf import CKF
from cdr.errors import InvalidInputError
from cdr.retrieval.embed import default_embedder
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK, build_topics_ckf, built_once

pytest.importorskip("langchain_core", reason="the langchain extra is not installed")
from langchain_core.embeddings import Embeddings, FakeEmbeddings
from langchain_core.vectorstores import InMemoryVectorStore

from cdr.integrations.langchain import CDRRetriever, index_from_vectorstore


class MiniLM(Embeddings):
    """cdr's offline MiniLM as a LangChain `Embeddings`: how an app's store was filled."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return default_embedder().encode(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


@pytest.fixture(scope="module")
def plain_ckf(tmp_path_factory: pytest.TempPathFactory) -> CKF:
    return CKF.open(built_once(tmp_path_factory, "lc-plain-ckf", lambda root: build_topics_ckf(
        root, ("types", "typesseq", "typesmapping", "truth"), recipe="plain")))


def _facts(ckf: CKF) -> tuple[list[str], list[dict[str, Any]]]:
    facts = ckf.facts(np.arange(ckf.n_rows))
    order = np.random.default_rng(3).permutation(len(facts))  # the app's own order
    return ([facts[i].content for i in order],
            [{"source": facts[i].source, "section": facts[i].section} for i in order])


def _envelopes(index: Any) -> list[list[str]]:
    gen = Generator(index, get_writer("extractive"),
                    GenerationConfig(max_windows=3, words=900, profile="focused"))
    session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
    return [list(e.prepared.envelope.fact_ids) for e in gen.run(BUILTIN_TYPES_TASK,
                                                                 session=session)]


def test_an_in_memory_store_ranks_as_a_ckf_of_the_same_facts(plain_ckf: CKF) -> None:
    texts, metas = _facts(plain_ckf)
    store = InMemoryVectorStore(MiniLM())
    store.add_texts(texts, metadatas=metas)
    index = index_from_vectorstore(store)
    assert index.n_rows == plain_ckf.n_rows and index.skipped == {}
    assert _envelopes(index) == _envelopes(plain_ckf)
    retriever = CDRRetriever.from_vectorstore(store, task=BUILTIN_TYPES_TASK,
                                              outline=BUILTIN_TYPES_OUTLINE)
    docs = retriever.invoke(BUILTIN_TYPES_TASK)
    assert docs and all(d.metadata["source"].endswith(".txt") for d in docs)


def test_a_store_another_model_filled_is_refused(plain_ckf: CKF) -> None:
    texts, metas = _facts(plain_ckf)
    store = InMemoryVectorStore(FakeEmbeddings(size=384))  # 384-d, but not MiniLM's vectors
    store.add_texts(texts[:10], metadatas=metas[:10])
    with pytest.raises(InvalidInputError, match=r"were not made by .*all-MiniLM-L6-v2"):
        index_from_vectorstore(store)
    narrow = InMemoryVectorStore(FakeEmbeddings(size=16))
    narrow.add_texts(texts[:3])
    with pytest.raises(InvalidInputError, match="width 16; the model 'minilm' makes 384-d"):
        index_from_vectorstore(narrow)


def test_a_store_over_a_qdrant_client_is_read_through_it(plain_ckf: CKF, tmp_path) -> None:
    """What langchain-qdrant's store holds: a `QdrantClient` and a collection name, with
    LangChain's payload (`page_content`, `metadata`)."""
    qdrant_client = pytest.importorskip("qdrant_client")
    texts, metas = _facts(plain_ckf)
    vectors = default_embedder().encode(texts)
    client = qdrant_client.QdrantClient(path=str(tmp_path / "q"))
    client.create_collection("app", vectors_config=qdrant_client.models.VectorParams(
        size=384, distance=qdrant_client.models.Distance.COSINE))
    client.upsert("app", points=[qdrant_client.models.PointStruct(
        id=str(uuid.UUID(int=i + 1)), vector=v.tolist(),
        payload={"page_content": t, "metadata": m})
        for i, (t, v, m) in enumerate(zip(texts, vectors, metas, strict=True))])

    class QdrantBacked:  # the two attributes a LangChain Qdrant store exposes
        def __init__(self) -> None:
            self.client, self.collection_name = client, "app"

        def similarity_search(self, query: str, k: int = 4) -> list[Any]:
            return []

    try:
        index = index_from_vectorstore(QdrantBacked())
        assert index.n_rows == plain_ckf.n_rows
        assert _envelopes(index) == _envelopes(plain_ckf)
    finally:
        client.close()


def test_a_store_of_another_kind_is_refused_by_name() -> None:
    class Elsewhere:
        def similarity_search(self, query: str, k: int = 4) -> list[Any]:
            return []

    with pytest.raises(InvalidInputError, match="cannot read the vectors of a LangChain "
                                                "Elsewhere"):
        index_from_vectorstore(Elsewhere())
