"""LangChain: the whole CDR loop written by a chat model, then the retriever driven by hand.

    pip install 'cdr-retrieval[langchain]' langchain-openai
    python examples/langchain_loop.py [CKF]

CKF defaults to ./my.ckf, built from a few topics of Python's language reference if missing.
The chat model is any OpenAI-compatible server: CDR_LLM_BASE_URL (default
http://127.0.0.1:8000/v1, e.g. `python -m llama_cpp.server`), CDR_LLM_MODEL, CDR_LLM_API_KEY.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from _docs import ensure_ckf
from cdr.integrations.langchain import CDRLoop, CDRRetriever

BASE_URL = os.environ.get("CDR_LLM_BASE_URL", "http://127.0.0.1:8000/v1")
MODEL = os.environ.get("CDR_LLM_MODEL", "my-model")
API_KEY = SecretStr(os.environ.get("CDR_LLM_API_KEY", "sk-local"))


def main(argv: list[str]) -> int:
    ckf = str(ensure_ckf(Path(argv[0] if argv else "my.ckf").resolve()))
    # [readme: langchain]
    llm = ChatOpenAI(base_url=BASE_URL, api_key=API_KEY, model=MODEL)
    task = "Write a guide to Python's built-in types"
    outline = ["Numeric types", "Sequence types", "Mapping types dict"]

    # The whole loop, the chat model writing every window:
    result = CDRLoop(ckf, llm).invoke({"task": task, "outline": outline})
    print(result["status"], len(result["document"]))

    # Or drive it yourself: each call returns the next window's envelope as Documents.
    retriever = CDRRetriever.from_ckf(ckf, task=task, outline="\n".join(outline))
    while not retriever.done:
        docs = retriever.invoke(task)
        if not docs:
            break
        reply = llm.invoke(retriever.messages())  # cdr's prompt: anchor, plan, facts F1..Fn
        retriever.record(reply)  # Stage 8, session update, exit rules
    print(retriever.trace()["status"], len(retriever.events))
    # [/readme]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
