"""LlamaIndex: any retriever does Phase 1, `CDRNodePostprocessor` reranks its nodes by CDR for
one session, and each window the model writes is recorded so the next window moves on.

    pip install 'cdr-retrieval[llamaindex]' openai
    python examples/llamaindex_rerank.py

The documents are a few topics of Python's language reference, one node per paragraph; the
writer is any OpenAI-compatible server: CDR_LLM_BASE_URL (default http://127.0.0.1:8000/v1),
CDR_LLM_MODEL, CDR_LLM_API_KEY.
"""

from __future__ import annotations

import os
import sys

from llama_index.core import SummaryIndex
from llama_index.core.schema import TextNode
from openai import OpenAI

from _docs import python_topics
from cdr.integrations.llamaindex import CDRNodePostprocessor

BASE_URL = os.environ.get("CDR_LLM_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("CDR_LLM_MODEL", "my-model")
API_KEY = os.environ.get("CDR_LLM_API_KEY", "sk-local")


def paragraphs() -> list[tuple[str, str]]:
    """(source, text) per paragraph of at least 12 words: the nodes' granularity."""
    return [(f"{name}#{i}", para) for name, text in python_topics()
            for i, para in enumerate(p.strip() for p in text.split("\n\n"))
            if len(para.split()) >= 12]


def main(argv: list[str]) -> int:
    my_documents = paragraphs()
    # [readme: llamaindex]
    nodes = [TextNode(text=t, metadata={"source": name}) for name, t in my_documents]
    retriever = SummaryIndex(nodes).as_retriever()  # any retriever: vector store, BM25, ...
    rerank = CDRNodePostprocessor.from_task("Write a guide to Python's built-in types",
                                            outline=["Numeric types", "Sequence types"], top_n=6)
    llm = OpenAI(base_url=BASE_URL, api_key=API_KEY)
    while not rerank.done:
        ranked = rerank.postprocess_nodes(retriever.retrieve("built-in types"),
                                          query_str="built-in types")
        facts = "\n\n".join(n.node.get_content() for n in ranked)
        reply = llm.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": f"Write the next section from these facts:\n{facts}"}])
        rerank.record(reply.choices[0].message.content or "")
    print(rerank.trace()["status"])
    # [/readme]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
