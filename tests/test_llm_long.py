"""Several real windows on the reference model, as a long document runs them (issue 22 §4–§5).

The `llm` tier (`make test-llm`): skipped with the reason when the model or its runtime is
absent. Kept to short windows so the tier stays a few minutes on 2 cores; the ≥ 5,000-word run
is the benchmark's (`make bench-long ARGS="--writer local"`). Structure only: windows, CRP
chunks and headers, the stored session, the writer's reuse count — never the text.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.gateway_server import OUTLINE, TASK, GatewayServer, base_env, delta_text
from tests.test_llm_e2e import CONTEXT, EXITS, HEADERS, N_CTX, model_path  # noqa: F401

pytestmark = pytest.mark.llm
pytest_plugins = ["tests.gateway_server"]

WINDOWS = 4
WINDOW_TOKENS = 96


@pytest.fixture(scope="module")
def contract_gateway(model_path, gateway_ckf, tmp_path_factory  # noqa: F811
                     ) -> Iterator[GatewayServer]:
    tmp = tmp_path_factory.mktemp("gw-long")
    env = base_env(tmp, CDR_WRITER="local", CDR_LOCAL_MODEL=str(model_path),
                   CDR_LOCAL_N_CTX=str(N_CTX))
    server = GatewayServer(env, ckf=gateway_ckf)
    server.start(timeout=180)
    yield server
    server.stop()


def test_gateway_streams_a_multi_window_document_under_the_length_contract(contract_gateway):
    """A streamed chat completion over several real windows with the length contract: every
    window has its `crp` chunk with the CRP headers, and the streamed document is the
    session's stored windows."""
    from openai import OpenAI

    from cdr.gateway.relay import assemble

    client = OpenAI(base_url=contract_gateway.openai_base_url, api_key="x", max_retries=0,
                    timeout=1800)
    # 96 tokens a window carry about 55 words: 240 words need more than the 4 windows allowed,
    # so the run writes every window (or stops on the band, task-complete)
    # The length contract alone over the spec loop ("profile": "spec"; the faces default to
    # focused, which includes it).
    crp = {"outline": OUTLINE, "words": 240, "window_tokens": WINDOW_TOKENS,
           "max_windows": WINDOWS, "context_tokens": CONTEXT, "length": "contract",
           "profile": "spec"}
    raw = client.chat.completions.with_raw_response.create(
        model="cdr", messages=[{"role": "user", "content": TASK}], stream=True,
        extra_body={"crp": crp})
    chunks = list(raw.parse())
    text = delta_text(chunks)
    extras = [c.model_extra.get("crp") for c in chunks]
    windows = [x for x in extras if x and x["event"] == "window"]
    (final,) = [x for x in extras if x and x["event"] == "final"]
    assert len(windows) >= 2
    assert [w["window"] for w in windows] == list(range(1, len(windows) + 1))
    for w in windows:
        assert all(h in w["headers"] for h in HEADERS), w["headers"]
        assert w["headers"]["CRP-Context-Window"] == f"{w['window']}/{WINDOWS}"
    assert final["status"] in EXITS and final["windows"] == len(windows)
    assert final["status"] != "limit-reached" or len(windows) == WINDOWS
    tr = httpx.get(f"{contract_gateway.url}/v1/sessions/{final['session_id']}",
                   headers={"Authorization": f"Bearer {final['token']}"}, timeout=30)
    assert tr.status_code == 200
    trace = tr.json()
    assert trace["options"] == {"length": "contract"}
    assert len(trace["windows"]) == len(windows)
    assert all(w["output"].strip() for w in trace["windows"])
    assert text == assemble([w["output"] for w in trace["windows"]])


def test_the_local_writer_counts_the_prefix_it_reuses(model_path):  # noqa: F811
    """Two windows whose prompts share their head: the second evaluates only what follows the
    common prefix, and the writer counts the reused tokens."""
    from cdr.writers.local import LocalWriter

    writer = LocalWriter(n_ctx=N_CTX)
    system = {"role": "system", "content": "You write reference documentation. " * 20}

    def window(question: str) -> None:
        writer.generate([system, {"role": "user", "content": question}], 8)

    window("Name one Python sequence type.")
    first = writer.reuse.timings[-1]
    window("Name one Python mapping type.")
    second = writer.reuse.timings[-1]
    assert writer.reuse.calls == 2 and len(writer.reuse.timings) == 2
    shared = len(writer._llm.tokenize(system["content"].encode(), add_bos=False))
    # the whole system prompt (and the chat template's head) was kept from the first call
    assert second.reused_tokens >= shared
    assert second.reused_tokens < second.prompt_tokens  # the question itself was evaluated
    assert writer.reuse.calls_reusing >= 1
    assert writer.reuse.reused_tokens == first.reused_tokens + second.reused_tokens
    assert second.evaluated_tokens == second.prompt_tokens - second.reused_tokens


def test_the_local_writer_goes_on_from_a_begun_answer(model_path):  # noqa: F811
    """`prefix=` (resume: "prefill"): the chat is framed by the model's own template up to its
    turn, so a prefixed call reuses the plain call's whole prompt as a token prefix; the prefix
    is counted in the prompt and is not handed back in the text."""
    from cdr.writers.local import LocalWriter

    writer = LocalWriter(n_ctx=N_CTX)
    messages = [{"role": "system", "content": "You write reference documentation."},
                {"role": "user", "content": "Write a short section about Python lists."}]
    plain = writer.generate(messages, 8)
    prefix = "## Lists\n\nA list is a mutable sequence written between square brackets."
    pieces: list[str] = []
    begun = writer.generate(messages, 8, prefix=prefix, on_delta=pieces.append)
    first, second = writer.reuse.timings
    prefix_tokens = len(writer._llm.tokenize(prefix.encode(), add_bos=False))
    assert second.prompt_tokens == first.prompt_tokens + prefix_tokens
    # everything the plain call evaluated before its answer is the begun call's head
    assert second.reused_tokens >= first.prompt_tokens - 1
    assert begun.usage["prompt_tokens"] == second.prompt_tokens
    # cut at 8 tokens: the text kept is its complete paragraphs, the rest `dropped_text`
    written = begun.text + begun.dropped_text
    assert "".join(pieces) == written and written.strip()
    assert not written.lstrip().startswith("## Lists")  # it went on, not from the start
    assert (plain.text + plain.dropped_text).strip()


def test_the_local_writer_stops_a_loop_and_goes_on_writing(model_path):  # noqa: F811
    """Asked to write one sentence over and over, the model loops: generation stops at the
    loop's second copy, well before the token limit, the window keeps the text before the
    loop, and the same loaded model writes the next window as usual."""
    from cdr.text.self_repeat import REPETITION, find_repeat
    from cdr.writers.local import LocalWriter

    writer = LocalWriter(n_ctx=N_CTX)
    sentence = "The tzinfo attribute holds the time zone of a datetime object."
    loop = writer.generate([{"role": "user", "content": (
        f"Write this exact sentence 30 times, one per line, and nothing else: {sentence}")}],
        400)
    assert loop.finish_reason == REPETITION
    assert loop.usage["completion_tokens"] < 400  # stopped, not run to the limit
    assert find_repeat(loop.text) is None and loop.dropped_text.strip()
    assert sentence.split()[1] in loop.text + loop.dropped_text
    after = writer.generate([{"role": "user", "content": "Name one Python mapping type."}], 16)
    assert after.finish_reason != REPETITION and (after.text + after.dropped_text).strip()
