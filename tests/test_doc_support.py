"""Document support (`documents: "support"`): the weights on an exact small case, the weighed
Phase 1 equal to a brute-force scan (hypothesis), refusals, and a real run with the option on,
alone and under BM25 fusion, whose trace records it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.ckf import CKF
from cdr.errors import InvalidInputError
from cdr.options import resolve_options
from cdr.retrieval.doc_support import (
    SupportedIndex,
    document_codes,
    document_support,
    home_document,
    section_pages,
    support_weights,
    supported_select,
)
from cdr.retrieval.gates import MINILM, SPEC_GATE, calibrated_gate
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from tests.conftest import BUILTIN_TYPES_OUTLINE, BUILTIN_TYPES_TASK
from tests.test_lexical import ArrayIndex


def test_weights_exact_on_two_documents():
    rows = np.array([0, 1, 2, 3])
    rel = np.array([0.8, 0.5, 0.6, 0.45], np.float32)
    codes = np.array([0, 0, 1, 1])
    # top_n 1: document 0's best is 0.8 (ratio 1), document 1's is 0.6 (ratio 0.75)
    np.testing.assert_allclose(support_weights(rows, rel, codes, 1.0, 1), [1, 1, 0.75, 0.75])
    np.testing.assert_allclose(support_weights(rows, rel, codes, 2.0, 1),
                               [1, 1, 0.5625, 0.5625], rtol=1e-6)
    np.testing.assert_allclose(support_weights(rows, rel, codes, 0.0), [1, 1, 1, 1])
    # the default top_n 3: supports (0.8 + 0.5 + 0) / 3 and (0.6 + 0.45 + 0) / 3
    ratio = (0.6 + 0.45) / (0.8 + 0.5)
    np.testing.assert_allclose(support_weights(rows, rel, codes, 2.0),
                               [1, 1, ratio ** 2, ratio ** 2], rtol=1e-6)
    assert support_weights(np.zeros(0, np.int64), np.zeros(0), codes).shape == (0,)
    # a gate at or below zero leaves nothing to weigh against: weights 1
    np.testing.assert_allclose(support_weights(rows, -rel, codes), [1, 1, 1, 1])
    with pytest.raises(ValueError, match="power"):
        support_weights(rows, rel, codes, float("nan"))


def test_support_is_the_mean_of_a_documents_best_facts():
    docs = np.array([0, 0, 0, 0, 1, 2, 2])
    rel = np.array([0.5, 0.9, 0.7, 0.6, 0.95, 0.6, 0.6])
    np.testing.assert_allclose(document_support(docs, rel, 3, 3),
                               [(0.9 + 0.7 + 0.6) / 3, 0.95 / 3, 1.2 / 3])
    np.testing.assert_allclose(document_support(docs, rel, 3, 1), [0.9, 0.95, 0.6])
    np.testing.assert_allclose(document_support(docs, rel, 4, 2), [0.8, 0.475, 0.6, 0.0])
    with pytest.raises(ValueError, match="top_n"):
        document_support(docs, rel, 3, 0)


def test_a_page_of_many_matching_facts_is_home_over_a_page_of_one():
    # document 7: a one-line summary page whose one fact matches best; document 3: the page
    # three of whose facts match well
    docs = np.array([7, 3, 3, 3, 5])
    rel = np.array([0.9, 0.7, 0.65, 0.6, 0.5])
    assert home_document(docs, rel) == 3
    assert home_document(docs, rel, top_n=1) == 7
    assert home_document(np.array([4, 2]), np.array([0.5, 0.5])) == 2  # a tie: lowest code
    assert home_document(np.zeros(0, np.int64), np.zeros(0)) is None


def test_a_sections_pages_are_its_home_and_every_page_at_the_gate():
    docs = np.array([7, 3, 3, 3, 5, 5, 5])
    rel = np.array([0.9, 0.7, 0.65, 0.6, 0.62, 0.61, 0.6])
    # supports: 7 → 0.3, 3 → 0.65 (the home), 5 → 0.61
    np.testing.assert_array_equal(section_pages(docs, rel, 0.6), [3, 5])
    np.testing.assert_array_equal(section_pages(docs, rel, 0.65), [3])
    np.testing.assert_array_equal(section_pages(docs, rel, 0.3), [3, 5, 7])
    np.testing.assert_array_equal(section_pages(docs, rel, 0.66), [3])  # the home alone
    assert section_pages(np.zeros(0, np.int64), np.zeros(0), 0.5).size == 0


def _brute_support(pairs: list[tuple[int, float]], doc: int, top_n: int) -> float:
    """A document's support by hand: the mean of its `top_n` best relevances, missing ones 0."""
    return sum(sorted((r for d, r in pairs if d == doc), reverse=True)[:top_n]) / top_n


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 1)), min_size=1, max_size=30),
       st.floats(0, 1))
def test_section_pages_equal_a_brute_force(pairs, gate):
    docs = np.array([d for d, _ in pairs])
    rel = np.array([r for _, r in pairs])
    support = {d: _brute_support(pairs, d, 3) for d in set(docs.tolist())}
    home = home_document(docs, rel)
    want = sorted({d for d, v in support.items() if v >= gate} | {home})
    got = section_pages(docs, rel, gate).tolist()
    # the sum's order may differ from the kernel's by an ulp at the gate itself
    near = {d for d, v in support.items() if abs(v - gate) < 1e-12}
    assert set(got) - near == set(want) - near and home in got
    assert got == sorted(got)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 1)), min_size=1, max_size=30),
       st.integers(1, 5))
def test_support_equals_a_brute_force(pairs, top_n):
    docs = np.array([d for d, _ in pairs])
    rel = np.array([r for _, r in pairs])
    want = [_brute_support(pairs, k, top_n) for k in range(6)]
    np.testing.assert_allclose(document_support(docs, rel, 6, top_n), want, atol=1e-12)


def test_one_document_is_never_weighed():
    rows = np.arange(5)
    rel = np.linspace(0.9, 0.4, 5).astype(np.float32)
    np.testing.assert_allclose(support_weights(rows, rel, np.zeros(5, np.int64)), np.ones(5))


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 40), docs=st.integers(1, 6), seed=st.integers(0, 10_000),
       gate=st.sampled_from([0.0, 0.2, 0.4]), power=st.sampled_from([0.0, 1.0, 2.0]),
       limit=st.sampled_from([None, 1, 3, 10]))
def test_supported_select_equals_a_brute_force_scan(n, docs, seed, gate, power, limit):
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(n, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    active = rng.random(n) > 0.2
    codes = rng.integers(0, docs, size=n)
    q = rng.normal(size=8).astype(np.float32)
    q /= np.linalg.norm(q)
    got = supported_select(ArrayIndex(emb, active), codes, q, gate, limit, power)
    cos = emb @ q
    cand = [i for i in range(n) if active[i] and cos[i] >= np.float32(gate)]
    by_doc: dict[int, list[float]] = {}
    for i in cand:
        by_doc.setdefault(int(codes[i]), []).append(float(cos[i]))
    best = {d: sum(sorted(v, reverse=True)[:3]) / 3 for d, v in by_doc.items()}
    top = max(best.values(), default=1.0)
    rel = {i: np.float32(cos[i] * np.float32((best[codes[i]] / top) ** power if top > 0 else 1))
           for i in cand}
    want = sorted((i for i in cand if rel[i] >= np.float32(gate)), key=lambda i: (-rel[i], i))
    want = want[:limit]
    assert got.indices.tolist() == want
    np.testing.assert_allclose(got.relevances, [rel[i] for i in want], atol=1e-6)
    np.testing.assert_allclose(got.embeddings, emb[want])


def test_refusals():
    emb = np.eye(3, dtype=np.float32)
    index = ArrayIndex(emb, np.ones(3, bool))
    with pytest.raises(ValueError, match="another state"):
        SupportedIndex(index, np.zeros(2, np.int64))
    with pytest.raises(InvalidInputError, match="min_relevance"):
        supported_select(index, np.zeros(3, np.int64), emb[0], float("nan"), None)
    with pytest.raises(InvalidInputError, match="unknown documents option 'all'"):
        resolve_options(None, documents="all")


@pytest.fixture(scope="module")
def types_ckf(types_ckf_path) -> CKF:
    return CKF.open(types_ckf_path)


def test_document_codes_name_each_source(types_ckf):
    codes = document_codes(types_ckf)
    assert codes.shape == (types_ckf.n_rows,)
    facts = types_ckf.facts(np.arange(types_ckf.n_rows))
    by_source: dict[str, set[int]] = {}
    for f, c in zip(facts, codes.tolist(), strict=True):
        by_source.setdefault(f.source, set()).add(c)
    assert all(len(c) == 1 for c in by_source.values())
    assert len({next(iter(c)) for c in by_source.values()}) == len(by_source)
    assert document_codes(types_ckf) is codes  # cached per state


@pytest.mark.parametrize("lexical", ["off", "bm25"])
def test_a_run_with_support_selects_a_subset_of_the_unweighed_pool(types_ckf, lexical):
    def pool(documents: str):
        gen = Generator(types_ckf, get_writer("extractive"),
                        GenerationConfig(max_windows=2, words=1200, lexical=lexical,
                                         documents=documents, min_relevance=0.40))
        session = gen.start(BUILTIN_TYPES_TASK, BUILTIN_TYPES_OUTLINE)
        return gen, session, gen.candidates(session)

    _, _, plain = pool("off")
    gen, session, weighed = pool("support")
    assert session.options.documents == "support"
    # at one gate, the weighing only takes away (the calibrated gates differ: see below)
    assert set(weighed.indices.tolist()) <= set(plain.indices.tolist())
    assert len(weighed) < len(plain)  # the distractor topics' facts are weighed out
    # the best-supported document's facts keep their relevance exactly
    before = dict(zip(plain.indices.tolist(), plain.relevances.tolist(), strict=True))
    codes = document_codes(types_ckf)
    top_doc = home_document(codes[plain.indices], plain.relevances)  # best-supported
    for r, rel in zip(weighed.indices.tolist(), weighed.relevances.tolist(), strict=True):
        assert rel <= before[r] + 1e-7
        if codes[r] == top_doc:
            assert rel == pytest.approx(before[r], abs=1e-7)
    events = list(gen.run(BUILTIN_TYPES_TASK, session=session))
    assert events and all(set(e.prepared.rows.tolist()) <= set(weighed.indices.tolist())
                          for e in events)


def test_calibrated_gates_and_their_fallbacks(types_ckf):
    short = f"{MINILM}#title-section-short"
    assert calibrated_gate(short) == 0.425
    assert calibrated_gate(short, "bm25") == 0.40
    assert calibrated_gate(short, "bm25", "support") == 0.325
    # no entry for support over the cosine alone: the gate of the relevance it weighs
    assert calibrated_gate(short, "off", "support") == 0.425
    assert calibrated_gate(f"{MINILM}#title-section", "bm25", "support") == 0.40
    assert calibrated_gate("other/model", "bm25", "support") == SPEC_GATE
    # a run picks its gate by the CKF's identity and the session's options
    assert types_ckf.model_id == short
    gen = Generator(types_ckf, get_writer("extractive"), GenerationConfig(profile="focused"))
    assert gen.min_relevance == calibrated_gate(short, "bm25", gen.options.documents)
