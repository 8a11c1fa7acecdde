"""Haystack integration (`pip install 'cdr-retrieval[haystack]'`, needs `haystack-ai` 2.x).

`CDRRetriever` is a Haystack component bound to one CDR session: each `run` returns the next
window's envelope as `Document`s (the CDR score components and the fact's source and section
in `meta`) and the prompt cdr built for it; passing `written=` (what the model wrote from the
last envelope) records it first — DPE Stage 8, the session's update, the exit rules — so the
next call moves on to what is not yet covered. `done` says an exit rule fired. The knowledge
base is anything `--ckf` takes (a CKF directory, a `qdrant:` address, `ray://...`) or a fact
index object.

Haystack sends usage telemetry unless `HAYSTACK_TELEMETRY_ENABLED=False` is set; cdr sets
nothing in the environment.
"""

from __future__ import annotations

import os
from typing import Any

try:
    from haystack import Document, component
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("cdr.integrations.haystack needs haystack-ai: "
                      "pip install 'cdr-retrieval[haystack]'") from exc

from cdr.integrations.windows import WindowHandout, envelope_facts
from cdr.window.loop import GenerationConfig, Generator, PreparedWindow

__all__ = ["CDRRetriever", "envelope_documents"]

def envelope_documents(prepared: PreparedWindow) -> list[Document]:
    """A prepared window's facts as Haystack Documents, in envelope order (`meta`:
    `cdr.integrations.windows.envelope_facts`; `score` is the CDR score)."""
    return [Document(id=fid, content=text, meta=meta, score=meta["score"])
            for fid, text, meta in envelope_facts(prepared)]


@component
class CDRRetriever:
    """The next window's facts for one CDR session; see the module docstring."""

    def __init__(self, knowledge_base: Any, *, task: str | None = None,
                 outline: str | None = None, profile: str | None = "focused",
                 max_windows: int = 5, words: int = 1800) -> None:
        from cdr.knowledge_base import open_fact_index
        from cdr.writers.extractive import ExtractiveWriter

        index = (open_fact_index(os.fspath(knowledge_base))
                 if isinstance(knowledge_base, str | os.PathLike) else knowledge_base)
        config = GenerationConfig(profile=profile, max_windows=max_windows, words=words)
        self.handout = WindowHandout(Generator(index, ExtractiveWriter(), config),
                                     task=task, outline=outline)

    @property
    def done(self) -> bool:
        return self.handout.done

    @component.output_types(documents=list[Document], prompt=str, done=bool)
    def run(self, query: str | None = None, written: str | None = None) -> dict[str, Any]:
        """`written`: what the model wrote from the last envelope (recorded first); `query`:
        the task, when none was given and no session has started."""
        if written is not None:
            self.handout.record(written)
        prepared = self.handout.envelope(query)
        if prepared is None:
            return {"documents": [], "prompt": "", "done": True}
        prompt = prepared.messages[-1]["content"] if prepared.messages else ""
        return {"documents": envelope_documents(prepared), "prompt": prompt,
                "done": self.handout.done}

    def trace(self) -> dict[str, Any]:
        """The session's trace (`cdr report` renders it)."""
        return self.handout.trace()
