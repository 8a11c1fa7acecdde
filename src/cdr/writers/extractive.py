"""The offline default writer: writes a window straight from its envelope.

It reads the same prompt an LLM gets (the loop's plan lines and numbered facts, see
`cdr.window.prompt`) and, for each planned section in order, writes its facts as paragraphs under
the section's heading until the section's word target or the window's token budget is reached;
asked to cite, it marks each paragraph with the ref of the fact it pasted.
What CDR put in the envelope is therefore exactly what the reader sees, which makes the
ranking's effect visible without a model, a network or a key.
"""

from __future__ import annotations

from collections.abc import Callable

from cdr.text.prompt_format import asks_citations, parse_prompt
from cdr.text.tokens import count_tokens
from cdr.writers.base import WriterResult, check_request


def _cited(fact: str, ref: str) -> str:
    """A pasted fact with its ref after its last line, where the prompt asks to cite (a fact
    that ends in code is left unmarked: the loop's attribution cites its prose exactly)."""
    if fact.rstrip().endswith(("```", "~~~")):
        return fact
    return f"{fact.rstrip()} [{ref}]"


class ExtractiveWriter:
    """Facts under their section headings, in plan order, within the budget."""

    name = "extractive"
    pastes_facts = True  # grounded by construction (`cdr.writers.base.Writer`)
    needs_model = False

    def __init__(self, min_section_words: int = 40) -> None:
        self.min_section_words = min_section_words

    def generate(
        self,
        messages: list[dict[str, str]],
        max_tokens: int,
        *,
        on_delta: Callable[[str], None] | None = None,
    ) -> WriterResult:
        check_request(messages, max_tokens)
        user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        plan, facts = parse_prompt(user)
        cite = asks_citations(user)
        parts: list[str] = []
        used = 0
        finish = "stop"
        for section in plan:
            paragraphs = [_cited(facts[f], f) if cite else facts[f]
                          for f in section.fact_refs if f in facts]
            if not paragraphs:
                continue
            heading = f"## {section.title}"
            cost = count_tokens(heading) + 2
            if used + cost > max_tokens:
                finish = "length"
                break
            block, words = [heading], 0
            block_tokens = cost
            for para in paragraphs:
                if words >= max(section.target_words, self.min_section_words):
                    break
                t = count_tokens(para) + 2
                if used + block_tokens + t > max_tokens:
                    finish = "length"
                    continue  # a shorter fact may still fit
                block.append(para)
                block_tokens += t
                words += len(para.split())
            if len(block) > 1:
                parts.append("\n\n".join(block))
                used += block_tokens
        text = "\n\n".join(parts)
        if on_delta is not None:
            for i, piece in enumerate(parts):
                on_delta(piece if i == 0 else "\n\n" + piece)
        completion = count_tokens(text) if text else 0
        prompt = sum(count_tokens(m["content"]) for m in messages)
        return WriterResult(
            text, finish,
            {"prompt_tokens": prompt, "completion_tokens": completion,
             "total_tokens": prompt + completion},
        )
