"""`cdr ingest` progress when stderr is not a terminal (a log file, a pipe, CI): plain lines
with counts, rate and time left, since a rich bar draws nothing there; and exit codes that
mean what a user expects (a file too small to hold a fact is listed, not an error)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.progress import Progress

from cdr.cli.ingest_progress import LINE_SECONDS, _Bar, _Lines, rate_text, speed_text
from tests.gateway_server import child_env

SENTENCE = ("Connection pooling keeps database connections open between requests so that "
            "each request does not pay for a new TCP handshake and authentication round trip.")


def test_rate_text_counts_rate_and_time_left() -> None:
    assert rate_text(0, 0, 0.0, "facts") == "0"
    assert rate_text(50, 200, 1.0, "facts") == "50/200 (25%), 50 facts/s, about 3 s left"
    assert rate_text(1_000, 23_000, 20.0, "facts") == \
        "1,000/23,000 (4%), 50 facts/s, about 7 min left"
    assert rate_text(3, 10, 2.0, "documents") == "3/10 (30%), 1.5 documents/s, about 5 s left"


@given(st.integers(0, 10**7), st.integers(0, 10**7), st.floats(0.0, 1e6))
def test_speed_text_is_the_rate_and_the_time_the_rest_takes_at_it(done: int, total: int,
                                                                  seconds: float) -> None:
    text = speed_text(done, total, seconds, "facts")
    if done == 0 or seconds == 0:
        assert text == ""
        return
    assert text.split(", ")[0].endswith(" facts/s")
    assert ("left" in text) == (total > done)
    assert rate_text(done, total, seconds, "facts").endswith(text)


def test_the_bar_shows_facts_per_second_and_the_time_left() -> None:
    """On a terminal the embedding bar carries the rate and the time left, from the stage's
    own count and estimate of its total, revised as documents are read."""
    now = [0.0]
    with Progress(console=Console(file=io.StringIO(), force_terminal=True),
                  auto_refresh=False) as progress:
        bar = _Bar(progress, clock=lambda: now[0])
        bar("embed", 0, 1_000)
        task = progress.tasks[0]
        assert task.fields["rate"] == ""
        now[0] = 10.0
        bar("embed", 500, 1_000)
        assert task.fields["rate"] == "50 facts/s, about 10 s left"
        now[0] = 20.0
        bar("embed", 1_000, 6_000)  # the estimate grew: more documents came in
        assert task.fields["rate"] == "50 facts/s, about 2 min left" and task.total == 6_000
        now[0] = 30.0
        bar("embed", 6_000, 6_000)
        assert task.fields["rate"] == "200 facts/s" and task.completed == 6_000
        bar("read", 1, 3)
        assert progress.tasks[1].description == "reading documents"


def test_lines_come_at_the_start_every_interval_and_at_the_end() -> None:
    buf = io.StringIO()
    now = [0.0]
    lines = _Lines(Console(file=buf, force_terminal=False, width=200), clock=lambda: now[0])
    for done in range(0, 101):  # one call per fact, a second apart
        now[0] = float(done)
        lines("embed", done, 100)
    lines.finish()
    out = buf.getvalue().splitlines()
    assert out[0] == "embedding facts: started"
    assert out[-1].startswith("embedding facts: 100/100 (100%)")
    periodic = out[1:-1]
    assert len(periodic) == int(100 // LINE_SECONDS) - 1  # every LINE_SECONDS, not every call
    assert all("facts/s" in x and "left" in x for x in periodic)


def test_cdr_ingest_piped_prints_progress_lines_and_exits_0_with_a_tiny_file(
        tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"page{i}.md").write_text(f"# Page {i}\n\n" + " ".join([SENTENCE] * 3) + "\n")
    (docs / "stub.md").write_text("# Stub\n\nSoon.\n")
    r = subprocess.run([sys.executable, "-m", "cdr.cli", "ingest", str(docs), "--ckf",
                        str(tmp_path / "kb.ckf")], capture_output=True, text=True,
                       env=child_env({}), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "reading documents: started" in r.stderr and "embedding facts: " in r.stderr
    assert "Files without a fact" in r.stdout and "stub.md" in r.stdout
    j = subprocess.run([sys.executable, "-m", "cdr.cli", "ingest", str(docs), "--ckf",
                        str(tmp_path / "kb2.ckf"), "--json"], capture_output=True, text=True,
                       env=child_env({}), timeout=300)
    assert j.returncode == 0 and j.stderr.strip() == "", j.stderr  # --json: no progress
    assert [Path(e["path"]).name for e in json.loads(j.stdout)["empty"]] == ["stub.md"]
