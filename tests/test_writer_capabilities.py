"""Writer capabilities instead of writer names: the loop and the gateway ask a writer what it
does (`pastes_facts`), and the CLI and settings ask the registry whether a name needs an
upstream model (`needs_model`)."""

from __future__ import annotations

import pytest

from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import WRITER_NAMES, get_writer, needs_model, pastes_facts
from cdr.writers.base import WriterResult


def test_the_registry_says_which_writers_need_a_model():
    assert {n: needs_model(n) for n in WRITER_NAMES} == {
        "extractive": False, "openai": True, "anthropic": True, "local": False}
    assert needs_model("some-future-api")  # unknown: ask for a model rather than guess


def test_pasting_is_a_property_of_the_writer_not_its_name():
    assert pastes_facts(get_writer("extractive"))
    assert not pastes_facts(get_writer("openai", model="m", base_url="http://127.0.0.1:9"))

    class Renamed:  # a fact-pasting writer under another name
        name = "my-paster"
        pastes_facts = True

    assert pastes_facts(Renamed()) and not pastes_facts(object())


class Recorder:
    """A prose writer that records what it was asked; `pastes_facts` set per instance."""

    name = "recorder"

    def __init__(self, pastes: bool) -> None:
        self.pastes_facts = pastes
        self.calls: list[list[dict[str, str]]] = []

    def generate(self, messages, max_tokens, *, on_delta=None) -> WriterResult:
        self.calls.append(messages)
        return WriterResult("Background\nUsage\n", "stop", {})


@pytest.mark.parametrize("pastes", [True, False])
def test_only_a_prose_writer_is_asked_for_the_outline(tiny_ckf_path, pastes):
    from cdr.ckf import CKF

    writer = Recorder(pastes)
    with CKF.open(tiny_ckf_path) as ckf:
        gen = Generator(ckf, writer, GenerationConfig(max_windows=1, words=400))
        sqs = gen.decompose("Write a guide to the pass statement")
    assert (len(writer.calls) == 0) == pastes
    if not pastes:
        assert [sq.text for sq in sqs] == ["Background", "Usage"]
