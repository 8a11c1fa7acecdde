"""50 sidecar sessions driven at once from many threads, windows interleaved across sessions,
with the same window sometimes submitted twice at the same moment: no update is lost or
applied twice (the duplicate gets the first one's answer), and every trace is exactly the
sequence of accepted windows."""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from queue import Empty, Queue
from typing import Any

import httpx
import pytest

from tests.gateway_server import OUTLINE, TASK

pytest_plugins = ["tests.gateway_server"]

SESSIONS = 50
THREADS = 16
MAX_WINDOWS = 6
# 50 words per sub-query: one section of ~60 words covers it, so each window covers one
# sub-query and a session takes two windows.
START = {"task": TASK, "outline": OUTLINE[:2], "words": 100, "max_windows": MAX_WINDOWS,
         "profile": "spec"}  # the protocol over the spec loop (the default is focused)


def one_section(envelope: dict[str, Any]) -> str:
    """A short window: the first planned section, from its first facts."""
    facts = {f["ref"]: f["content"] for f in envelope["facts"]}
    section = envelope["plan"][0]
    paras: list[str] = []
    for ref in section["fact_refs"]:
        paras.append(" ".join(facts[ref].split()[:80]))
        if sum(len(p.split()) for p in paras) >= 60:
            break
    return f"## {section['title']}\n\n" + "\n\n".join(paras)


class Driver:
    def __init__(self, url: str) -> None:
        self.local = threading.local()
        self.url = url
        self.accepted: dict[str, list[str]] = defaultdict(list)
        self.statuses: list[int] = []
        self.duplicates: list[tuple[int, int]] = []
        self.envelope_pairs: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def http(self) -> httpx.Client:
        if not hasattr(self.local, "client"):
            self.local.client = httpx.Client(base_url=self.url, timeout=120)
        return self.local.client

    def note(self, *codes: int) -> None:
        with self.lock:
            self.statuses.extend(codes)

    def post(self, path: str, token: str, **kw: Any) -> httpx.Response:
        r = self.http().post(path, headers={"Authorization": f"Bearer {token}"}, **kw)
        self.note(r.status_code)
        return r

    def both(self, fn: Any) -> list[httpx.Response]:
        """Run `fn` twice at the same moment (two threads behind a barrier)."""
        barrier = threading.Barrier(2)

        def go() -> httpx.Response:
            barrier.wait()
            return fn()

        with ThreadPoolExecutor(2) as pool:
            return list(pool.map(lambda _: go(), range(2)))

    def step(self, index: int, sid: str, token: str) -> tuple[str, bool]:
        """One window of one session; returns the next token and whether it is done."""
        if index % 5 == 1:
            pair = self.both(lambda: self.post(f"/v1/sessions/{sid}/envelope", token))
            assert [r.status_code for r in pair] == [200, 200], [r.text for r in pair]
            self.envelope_pairs.append((pair[0].json()["etag"], pair[1].json()["etag"]))
            env = pair[0].json()
        else:
            r = self.post(f"/v1/sessions/{sid}/envelope", token)
            assert r.status_code == 200, r.text
            env = r.json()
        text = one_section(env)
        body = {"text": text, "etag": env["etag"]}
        if index % 5 == 0:
            pair = self.both(lambda: self.post(f"/v1/sessions/{sid}/windows", env["token"],
                                               json=body))
            codes = sorted(r.status_code for r in pair)
            with self.lock:
                self.duplicates.append((codes[0], codes[1]))
            # Identical duplicates: one is applied, the other is its replay (same answer,
            # current token); the traces below show the window applied once.
            assert codes == [200, 200], [r.text for r in pair]
            a, b = (dict(r.json(), token=None, headers=None) for r in pair)
            assert a == b
            res = pair[0].json()
        else:
            r = self.post(f"/v1/sessions/{sid}/windows", env["token"], json=body)
            assert r.status_code == 200, r.text
            res = r.json()
        with self.lock:
            self.accepted[sid].append(text)
        return res["token"], res["done"]


@pytest.mark.slow
def test_fifty_interleaved_sessions_lose_no_update(gateway):
    driver = Driver(gateway.url)

    def create(i: int) -> tuple[int, str, str]:
        r = driver.http().post("/v1/sessions", json=START)
        driver.note(r.status_code)
        assert r.status_code == 201, r.text
        return i, r.json()["session_id"], r.json()["token"]

    with ThreadPoolExecutor(THREADS) as pool:
        sessions = list(pool.map(create, range(SESSIONS)))

    # A shared work queue of (index, sid, token): each worker takes one session, runs one
    # window and puts it back at a random place, so windows of all sessions interleave.
    work: Queue[tuple[int, str, str] | None] = Queue()
    order = list(sessions)
    random.Random(7).shuffle(order)
    for item in order:
        work.put(item)
    remaining = [len(sessions)]
    finished: dict[str, str] = {}
    failures: list[BaseException] = []
    lock = threading.Lock()

    def worker() -> None:
        while True:
            try:
                item = work.get(timeout=0.2)
            except Empty:
                with lock:
                    if remaining[0] == 0 or failures:
                        return
                continue
            if item is None:
                return
            index, sid, token = item
            try:
                token, done = driver.step(index, sid, token)
            except BaseException as exc:
                with lock:
                    failures.append(exc)
                return
            if done:
                with lock:
                    finished[sid] = token
                    remaining[0] -= 1
            else:
                work.put((index, sid, token))

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]

    assert len(finished) == SESSIONS
    assert all(code < 500 for code in driver.statuses)
    assert len(driver.duplicates) >= SESSIONS // 5
    assert set(driver.duplicates) == {(200, 200)}
    assert all(a == b for a, b in driver.envelope_pairs)

    http = driver.http()
    for _, sid, _ in sessions:
        r = http.get(f"/v1/sessions/{sid}",
                     headers={"Authorization": f"Bearer {finished[sid]}"})
        assert r.status_code == 200, r.text
        trace = r.json()
        texts = driver.accepted[sid]
        assert trace["status"] == "task-complete"
        assert [w["number"] for w in trace["windows"]] == list(range(1, len(texts) + 1))
        assert [w["output"] for w in trace["windows"]] == texts
        assert r.headers["CRP-Context-Window"] == f"{len(texts)}/{MAX_WINDOWS}"
        assert 2 <= len(texts) <= MAX_WINDOWS
