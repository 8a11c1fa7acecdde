"""In-process pieces of the gateway: the streamed document equals the assembled one, a stored
envelope completes exactly like the prepared one, error mapping, token extraction, caps."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdr.ckf.handle import CKF
from cdr.errors import EmbeddingModelMismatchError, InvalidInputError, NotFoundError, UpstreamError
from cdr.gateway.app_state import Gateway, token_from_headers
from cdr.gateway.errors import ApiError, from_cdr_error, from_validation_errors
from cdr.gateway.relay import DocumentText, assemble
from cdr.gateway.schemas import GenerationOptions
from cdr.gateway.session_record import SessionRecord
from cdr.gateway.session_store import MemorySessionStore, VersionConflictError
from cdr.gateway.session_token import ExpiredTokenError, StaleTokenError, TokenModelMismatchError
from cdr.gateway.settings import GatewaySettings
from cdr.trace import window_record
from cdr.window.loop import EmptyKnowledgeBaseError, GenerationConfig, Generator, PreparedWindow
from cdr.writers import get_writer
from tests.gateway_server import OUTLINE, TASK, WINDOW_TOKENS, WORDS

pytest_plugins = ["tests.gateway_server"]

piece = st.text(alphabet=st.sampled_from(list("ab \n\t#")), max_size=8)


@given(st.lists(st.lists(piece, max_size=6), max_size=6))
def test_streamed_pieces_concatenate_to_the_assembled_document(windows):
    doc = DocumentText()
    streamed = "".join(doc.feed(n, p) for n, pieces in enumerate(windows, 1) for p in pieces)
    assert streamed == assemble(["".join(pieces) for pieces in windows])


def test_assemble_strips_windows_and_drops_empty_ones():
    assert assemble(["  ## A\n\nx \n", "\n\n", "## B\ny"]) == "## A\n\nx\n\n## B\ny"
    assert assemble([]) == ""


@pytest.fixture(scope="module")
def ckf(gateway_ckf):
    with CKF.open(gateway_ckf) as store:
        yield store


def test_a_stored_envelope_completes_exactly_like_the_prepared_one(ckf):
    gen = Generator(ckf, get_writer("extractive"), GenerationConfig(max_windows=4, words=WORDS,
                                                                  generation_tokens=WINDOW_TOKENS))
    session = gen.start(TASK, "\n".join(OUTLINE))
    for _ in range(2):
        prepared = gen.prepare(session)
        stored = json.loads(json.dumps(prepared.to_dict()))  # through the store's JSON
        loaded = PreparedWindow.from_dict(stored)
        assert loaded.envelope.etag == prepared.envelope.etag
        assert loaded.to_dict() == stored
        assert loaded.headers(session) == prepared.headers(session)
        text = gen.write(prepared).text
        twin = copy.deepcopy(session)
        a = gen.complete(session, prepared, text)
        b = gen.complete(twin, loaded, text)
        assert (a.headers, a.status, a.completeness, a.residual) == (
            b.headers, b.status, b.completeness, b.residual)
        assert window_record(a) == window_record(b)
        assert session.to_json() == twin.to_json()
    with pytest.raises(InvalidInputError, match="damaged"):
        PreparedWindow.from_dict({**stored, "ranking": {}})


def test_session_record_round_trips(ckf):
    gen = Generator(ckf, get_writer("extractive"), GenerationConfig(max_windows=3, words=WORDS,
                                                                  generation_tokens=WINDOW_TOKENS))
    session = gen.start(TASK, "\n".join(OUTLINE))
    prepared = gen.prepare(session)
    event = gen.complete(session, prepared, gen.write(prepared).text)
    rec = SessionRecord(session, [window_record(event)], gen.prepare(session).to_dict(),
                        "chat", {"max_windows": 3})
    back = SessionRecord.from_json(rec.to_json(), ckf.ngram_index)
    assert back.to_json() == rec.to_json()
    assert back.trace("s1") == rec.trace("s1")
    assert back.trace("s1")["windows"][0]["number"] == 1
    for bad in ("{", "[]", json.dumps({"format": "other"})):
        with pytest.raises(InvalidInputError):
            SessionRecord.from_json(bad)


@pytest.mark.parametrize(("exc", "status", "code"), [
    (StaleTokenError(1, 2), 409, "stale_token"),
    (ExpiredTokenError(5, 10.0), 401, "expired_token"),
    (TokenModelMismatchError("model-a", "model-b"), 409, "embedding_model_mismatch"),
    (EmbeddingModelMismatchError("model-a", "model-b"), 409, "embedding_model_mismatch"),
    (VersionConflictError("s", 1, 2), 409, "version_conflict"),
    (NotFoundError("no session 'x'"), 404, None),
    (InvalidInputError("task is empty"), 422, None),
    (EmptyKnowledgeBaseError("empty"), 409, "empty_knowledge_base"),
    (UpstreamError("overloaded", 529), 502, "upstream_failed"),
])
def test_library_errors_map_to_statuses(exc, status, code):
    err = from_cdr_error(exc)
    assert (err.status, err.code) == (status, code)
    body = err.body()["error"]
    if isinstance(exc, UpstreamError):  # summarised: the upstream's own words never pass
        assert body["upstream_status"] == 529
        assert body["message"] == "upstream LLM failed: HTTP 529 error"
    else:
        assert str(exc) in body["message"]
    if isinstance(exc, EmbeddingModelMismatchError):
        assert (body["expected"], body["got"]) == ("model-a", "model-b")
    if isinstance(exc, EmptyKnowledgeBaseError):
        assert err.headers["CRP-Context-Mode"] == "safety-only"


def test_validation_errors_name_the_fields():
    bad_json = from_validation_errors([{"type": "json_invalid", "loc": ("body", 7),
                                        "msg": "JSON decode error",
                                        "ctx": {"error": "Expecting value"}}])
    assert bad_json.status == 400 and "position 7" in bad_json.message
    fields = from_validation_errors([
        {"type": "missing", "loc": ("body", "task"), "msg": "Field required"},
        {"type": "int_parsing", "loc": ("body", "max_windows"), "msg": "not an int"}])
    assert fields.status == 422 and fields.param == "task"
    assert "task: Field required" in fields.message and "max_windows" in fields.message
    assert [d["field"] for d in fields.extra["details"]] == ["task", "max_windows"]


def test_token_comes_from_bearer_or_crp_session():
    assert token_from_headers({"authorization": "Bearer abc"}) == "abc"
    assert token_from_headers({"authorization": "bearer  abc "}) == "abc"
    assert token_from_headers({"crp-session": "xyz"}) == "xyz"
    assert token_from_headers({"authorization": "Basic dXNlcg==", "crp-session": "t"}) == "t"
    for headers in ({}, {"authorization": "Bearer "}, {"crp-session": "  "}):
        with pytest.raises(ApiError) as e:
            token_from_headers(headers)
        assert e.value.status == 401 and e.value.code == "missing_token"


def test_options_apply_defaults_and_the_window_cap(tmp_path, ckf):
    settings_ = GatewaySettings(_env_file=None, dev=True, session_db=tmp_path / "s.db",
                                max_windows_cap=3)
    gw = Gateway(settings_, ckf=ckf, store=MemorySessionStore())
    try:
        # the profile is the faces' default (cdr.options.FACES_PROFILE), stored with the session
        assert gw.options(None) == {"max_windows": 3, "ranking": "cdr", "profile": "focused"}
        assert gw.options(GenerationOptions(words=900, ranking="mmr", max_windows=2,
                                            window_tokens=500, context_tokens=4096)) == {
            "max_windows": 2, "ranking": "mmr", "words": 900, "generation_tokens": 500,
            "context_tokens": 4096, "profile": "focused"}
        with pytest.raises(ApiError) as e:
            gw.options(GenerationOptions(max_windows=4))
        assert e.value.status == 422 and "cap of 3" in e.value.message
    finally:
        gw.close()


def test_outline_options_are_checked():
    assert GenerationOptions(outline=["a", " b "]).outline_text() == "a\nb"
    assert GenerationOptions(outline="- a\n- b").outline_text() == "- a\n- b"
    for bad in ([], [""], ["a\nb"], "\n \n"):
        with pytest.raises(ValueError, match="outline"):
            GenerationOptions(outline=bad)


@pytest.mark.parametrize(("message", "status", "summary"), [
    ("openai writer: http://10.0.0.5:8000/v1/chat/completions answered HTTP 401: "
     '{"error": "bad key sk-live-abcdefgh12345678"} (check the API key)', 401,
     'HTTP 401 Unauthorized (check CDR_LLM_API_KEY): {"error": "bad key [redacted]"}'),
    ("openai writer: no answer from https://llm.internal/v1 within the 60 s timeout "
     "(ReadTimeout) (gave up after 3 attempts)", None,
     "no answer within the timeout (after 3 attempts)"),
    ("openai writer: connection to http://127.0.0.1:9/v1 failed (ConnectError: refused) "
     "(gave up after 1 attempt)", None, "connection failed (after 1 attempts)"),
])
def test_upstream_errors_are_summarised(message: str, status: int | None,
                                        summary: str) -> None:
    body = from_cdr_error(UpstreamError(message, status)).body()["error"]
    assert body["message"] == f"upstream LLM failed: {summary}"


def test_redact_masks_secrets_urls_and_hosts() -> None:
    from cdr.gateway.redact import redact, register_secret

    register_secret("my-very-own-upstream-key")
    text = redact("sent Authorization: Bearer my-very-own-upstream-key to "
                  "https://api.example.com/v1?key=zzz from 10.1.2.3:8080, api_key=abcdef")
    assert "my-very-own" not in text and "api.example.com" not in text
    assert "10.1.2.3" not in text and "abcdef" not in text


def test_public_paths() -> None:
    from cdr.gateway.paths import public_path, public_sources

    assert public_path("/srv/corpus/guide/intro.md") == "guide/intro.md"
    assert public_path("upload/a.md") == "upload/a.md"
    assert public_path("https://x.org/a/b") == "https://x.org/a/b"
    assert public_path("C:\\data\\docs\\a.md") == "docs/a.md"
    assert public_sources({"documents": [{"source": "/a/b/c.txt", "n": 1}]}) == \
        {"documents": [{"source": "b/c.txt", "n": 1}]}


def test_metrics_fold_unknown_labels() -> None:
    from cdr.gateway.metrics import GatewayMetrics

    m = GatewayMetrics()
    for i in range(50):
        m.observe_request(None, f"FOO{i}", 405, 0.001)
    m.observe_request("/healthz", "get", 200, 0.001)
    samples = {tuple(sorted(s.labels.items())) for metric in m.requests.collect()
               for s in metric.samples if s.name.endswith("_total")}
    assert samples == {(("method", "other"), ("route", "other"), ("status", "405")),
                       (("method", "GET"), ("route", "/healthz"), ("status", "200"))}


def _asgi_client(ring, client_host: str):
    import httpx
    from starlette.responses import JSONResponse

    from cdr.gateway.auth import AuthMiddleware

    async def app(scope, receive, send):
        key = scope["state"].get("api_key")
        await JSONResponse({"scope": key.scope if key else None})(scope, receive, send)

    transport = httpx.ASGITransport(app=AuthMiddleware(app, ring=ring),
                                    client=(client_host, 5555))
    return httpx.AsyncClient(transport=transport, base_url="http://gw")


@pytest.mark.parametrize(("host", "status"), [("127.0.0.1", 200), ("::1", 200),
                                              ("10.0.0.7", 403), ("203.0.113.9", 403)])
def test_dev_mode_answers_loopback_clients_only(host: str, status: int) -> None:
    import asyncio

    async def go():
        async with _asgi_client(None, host) as c:
            return await c.post("/v1/sessions", json={})

    r = asyncio.run(go())
    assert r.status_code == status
    if status == 403:
        assert r.json()["error"]["code"] == "dev_mode_loopback_only"


@pytest.mark.parametrize(("method", "path", "key", "status"), [
    ("POST", "/v1/ckf/documents", "gen", 403),
    ("DELETE", "/v1/ckf/documents/x", "gen", 403),
    ("GET", "/v1/ckf/documents", "gen", 200),
    ("POST", "/v1/ckf/documents", "adm", 200),
    ("POST", "/v1/chat/completions", "adm", 200),
    ("POST", "/v1/chat/completions", None, 401),
    ("GET", "/v1/no/such/route", None, 401),
    ("GET", "/healthz", None, 200),
    ("GET", "/metrics", None, 200),
])
def test_scopes(method: str, path: str, key: str | None, status: int) -> None:
    import asyncio

    from cdr.gateway.auth import KeyRing, parse_api_keys

    gen, adm = "cdr_gen_Xq3vT9LmP2wR8sK4nB7yH1cJ6dF0gA5e", "cdr_adm_Zr8pQ2mW5tY1uI7oL3kJ9hG4fD"
    ring = KeyRing(parse_api_keys(f"generate:{gen},admin:{adm}"))
    headers = {"Authorization": f"Bearer {gen if key == 'gen' else adm}"} if key else {}

    async def go():
        async with _asgi_client(ring, "198.51.100.1") as c:
            return await c.request(method, path, headers=headers)

    r = asyncio.run(go())
    assert r.status_code == status, r.text
    if status == 401:
        assert r.headers["www-authenticate"].startswith("Bearer")
