"""The gateway through the official `openai` client: one document non-streamed (the CRP
headers on the response), then the same task streamed (the windows arrive as chunks, each
chunk's `crp` field carrying what is known so far).

Start a gateway first, e.g. on your own machine:

    cdr models install embedder
    cdr ingest my-docs/ --ckf my.ckf
    CDR_DEV=1 cdr serve --ckf my.ckf --port 8088
    python examples/gateway_openai.py http://127.0.0.1:8088/v1 ["TASK" ["SECTION" ...]]

A gateway with API keys wants a `generate` key: set CDR_API_KEY (see `cdr keygen`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from openai import OpenAI

TASK = "Write a guide to Python's built-in types"
OUTLINE = ["Truth value testing", "Sequence types"]


def main(argv: list[str]) -> int:
    base_url = argv[0] if argv else "http://127.0.0.1:8088/v1"
    client = OpenAI(base_url=base_url, api_key=os.environ.get("CDR_API_KEY", "none"),
                    timeout=600, max_retries=0)
    task = argv[1] if len(argv) > 1 else TASK
    outline = argv[2:] or OUTLINE
    messages: list[Any] = [{"role": "user", "content": task}]
    crp: dict[str, Any] = {"outline": outline, "max_windows": 3, "words": 600,
                           "ranking": "cdr"}

    # [readme: gateway]
    raw = client.chat.completions.with_raw_response.create(
        model="cdr", messages=messages, extra_body={"crp": crp})
    document = raw.parse().choices[0].message.content or ""
    print("status:", raw.headers["CRP-Context-Continuation-Status"],
          "windows:", raw.headers["CRP-Context-Window"], "words:", len(document.split()))

    streamed: list[str] = []
    last_crp: dict[str, Any] = {}
    for chunk in client.chat.completions.create(
            model="cdr", messages=messages, stream=True, extra_body={"crp": crp}):
        if chunk.choices and chunk.choices[0].delta.content:
            streamed.append(chunk.choices[0].delta.content)
        last_crp = (chunk.model_extra or {}).get("crp") or last_crp
    print("streamed words:", len("".join(streamed).split()), "final:", last_crp.get("status"))
    # [/readme]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
