"""Every `CDR_*` environment variable cdr reads: its name, type, default and meaning, in one
place.

This module is also the one place cdr touches the process environment: code asks `env(NAME)`
(or `cache_dir()`), which reads the variable at call time — never cached at import, so a
variable set after import (a test's `monkeypatch.setenv`, a gateway worker's completed
environment) is what the next call sees — and refuses a `CDR_*` name this table does not list.
`export` is the one writer, for what the process starts next (the gateway's worker processes,
Ray's client). The gateway's `GatewaySettings` reads its `CDR_*` fields through pydantic-settings
and the CLI's `--ckf`/`--writer`/`--embedder` options through click's `envvar`, both declared
against the names here; `tests/test_settings_env.py` checks that no other module of cdr reads
or writes `os.environ`. `docs/reference/settings.md` is
generated from it by `docs/gen_reference.py`, and `tests/test_docs_pages.py` checks that the
page is current, that every `CDR_*` name in the code has an entry here, and that each gateway
setting's default is the one `GatewaySettings` declares, so a new variable cannot go
undocumented. Text is Markdown, as the reference shows it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import overload

__all__ = ["GROUPS", "SETTINGS", "Setting", "cache_dir", "env", "environment", "export",
           "setting"]

# Where a variable is read: the reference's sections, in order.
GROUPS: dict[str, str] = {
    "gateway": "Gateway (`GatewaySettings`)",
    "process": "Gateway process",
    "library": "Library, CLI and writers",
    "tests": "Tests and benchmarks only",
}


@dataclass(frozen=True)
class Setting:
    """One environment variable: `group` is a key of `GROUPS`."""

    name: str
    group: str
    type: str
    default: str
    meaning: str


SETTINGS: tuple[Setting, ...] = (
    Setting(
        'CDR_CKF', 'gateway',
        type='path or `ray://HOST:PORT/PATH`',
        default='none',
        meaning=('The knowledge base named `default`: a CKF directory, or a shard set served '
                 'by Ray. Also read by `cdr generate`, `cdr ingest` and `cdr ckf ...` as their'
                 ' `--ckf`.')),
    Setting(
        'CDR_KBS', 'gateway',
        type='comma-separated `name=path` (path a CKF directory or `ray://...`)',
        default='none',
        meaning=('More knowledge bases, by name (what `cdr serve --kb NAME=PATH` sets); see '
                 '[several teams](../tenants.md).')),
    Setting(
        'CDR_KB_CONFIG', 'gateway',
        type='path of a TOML file',
        default='none',
        meaning=('A `[kbs]` table of `name = "path"` lines (relative to the file); `cdr serve '
                 '--kb-config`.')),
    Setting(
        'CDR_WRITER', 'gateway',
        type='`extractive`, `openai`, `anthropic`, `local`',
        default='`extractive`',
        meaning=('Who writes windows: the offline extractive writer, any OpenAI-compatible '
                 'server, Anthropic, or the in-process llama.cpp model. Also `cdr generate '
                 '--writer`.')),
    Setting(
        'CDR_LLM_BASE_URL', 'gateway',
        type='URL',
        default='none',
        meaning=("The OpenAI-compatible server's base URL (`--writer openai`). Also read by "
                 '`cdr generate`.')),
    Setting(
        'CDR_LLM_MODEL', 'gateway',
        type='string',
        default='none',
        meaning='The model name the writer asks for. Also read by `cdr generate`.'),
    Setting(
        'CDR_LLM_API_KEY', 'gateway',
        type='secret',
        default='none',
        meaning=("The LLM's API key (else `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`). Masked in "
                 'every error, stream and trace.')),
    Setting(
        'CDR_SIGNING_SECRET', 'gateway',
        type='secret: one secret, or `kid1:secret1,kid2:secret2`',
        default='none (required unless `CDR_DEV=1`)',
        meaning=('Signs session tokens (HS256 JWTs with per-session HKDF keys); in a ring the '
                 'first is active. A weak secret is refused. The same on every replica.')),
    Setting(
        'CDR_DEV', 'gateway',
        type='bool',
        default='`false`',
        meaning=('Development mode: no API keys or signing secret needed, loopback only '
                 '(`--host 0.0.0.0` is refused), every caller is an admin.')),
    Setting(
        'CDR_API_DOCS', 'gateway',
        type='bool',
        default='`false`',
        meaning=('Serve Swagger UI at `/docs` and ReDoc at `/redoc` (their scripts come from a'
                 ' CDN, under a strict CSP); off because they run third-party code on the '
                 "gateway's origin. `/openapi.json` is always served.")),
    Setting(
        'CDR_SESSION_DB', 'gateway',
        type='path or `postgresql://` URL',
        default='none: `<CKF>/sessions.sqlite3`, or a temp file in dev mode without a CKF',
        meaning=('Where sessions and upload jobs live: SQLite, or PostgreSQL shared by '
                 'replicas.')),
    Setting(
        'CDR_SESSION_DB_SYNCHRONOUS', 'gateway',
        type='`NORMAL`, `FULL`',
        default='`NORMAL`',
        meaning=("SQLite's `synchronous`: `NORMAL` survives process crashes, `FULL` also power"
                 ' cuts, at one fsync per session write.')),
    Setting(
        'CDR_TOKEN_TTL_SECONDS', 'gateway',
        type='int > 0',
        default='`3600`',
        meaning='Lifetime of a session token.'),
    Setting(
        'CDR_MAX_BODY_BYTES', 'gateway',
        type='int > 0',
        default='`10000000`',
        meaning='Largest request body; larger is 413.'),
    Setting(
        'CDR_MAX_WINDOWS_CAP', 'gateway',
        type='int ≥ 1',
        default='`20`',
        meaning='The most windows one request may ask for.'),
    Setting(
        'CDR_MIN_RELEVANCE', 'gateway',
        type='float in [-1, 1]',
        default=("none (the embedding model's calibrated gate: 0.40 for the default model, "
                 'else 0.55)'),
        meaning=("Phase 1's relevance gate for the gateway's sessions. "
                 "(`cdr.spec.CDR_MIN_RELEVANCE` is the spec's constant 0.55, a different "
                 'thing.)')),
    Setting(
        'CDR_API_KEYS', 'gateway',
        type='secret: comma-separated `scope:key`, `scope@kb1+kb2:key` or `scope@*:key`',
        default='none (required unless `CDR_DEV=1`)',
        meaning=('API keys with scopes `generate` or `admin`, optionally limited to named '
                 'knowledge bases ([several teams](../tenants.md)); `key` is `sha256:<hex>` '
                 '(what `cdr keygen` prints) or a plain random key.')),
    Setting(
        'CDR_READ_TIMEOUT_SECONDS', 'gateway',
        type='float in (0, 3600]',
        default='`15.0`',
        meaning=("Deadline for a request's headers, and for its whole body once the headers "
                 'are in (else 408).')),
    Setting(
        'CDR_KEEPALIVE_SECONDS', 'gateway',
        type='float in (0, 3600]',
        default='`30.0`',
        meaning=('How long an idle keep-alive connection stays open: longer than the 5 s httpx'
                 ' and the `openai` client keep one, so a client never reuses a socket the '
                 'server is closing.')),
    Setting(
        'CDR_MAX_HEADER_BYTES', 'gateway',
        type='int in [1024, 1048576]',
        default='`32768`',
        meaning='Request line plus headers; larger is 431.'),
    Setting(
        'CDR_RAY_RETRY_SECONDS', 'gateway',
        type='float in (0, 3600]',
        default='`60.0`',
        meaning=('With a `ray://` CKF: how long a request waits for a dead shard actor before '
                 'a 503 naming the shard.')),
    Setting(
        'CDR_JOB_LEASE_SECONDS', 'gateway',
        type='float in [1, 3600]',
        default='`30.0`',
        meaning=("An upload job's lease: a replica killed mid-job has its jobs marked failed "
                 'this long after its last renewal.')),
    Setting(
        'CDR_UPLOAD_COMMIT_FACTS', 'gateway',
        type='int in [1, 100000]',
        default='`256`',
        meaning=('Facts per committed batch of an upload job (what a killed replica can lose '
                 'at most).')),
    Setting(
        'CDR_CHAT_THREADS', 'gateway',
        type='int ≥ 1',
        default='`64`',
        meaning=('Chat completion runs written at once per gateway process (each holds a '
                 'thread for its whole run).')),
    Setting(
        'CDR_MAX_WAITING_RUNS', 'gateway',
        type='int ≥ 0',
        default='`64`',
        meaning=('Chat completion runs that may wait for a chat thread (`CDR_CHAT_THREADS`); '
                 'past them a run is refused at once with 503 and `Retry-After` instead of '
                 'queueing silently.')),
    Setting(
        'CDR_MAX_RUNS_PER_KEY', 'gateway',
        type='int ≥ 1',
        default='`32`',
        meaning=('Chat completion runs one API key may have admitted (writing or waiting); '
                 'past them its next run is refused with 429 and `Retry-After`.')),
    Setting(
        'CDR_RESUME_WAIT_SECONDS', 'gateway',
        type='float in [0, 3600]',
        default='`60.0`',
        meaning=('A stream resumed with `Last-Event-ID` while its run is still writing a '
                 'window (on this process or a replica) waits this long for the window to be '
                 'stored; past it, 409 (`session_busy` or `stream_ahead_of_store`).')),
    Setting(
        'CDR_CONFIG', 'process',
        type='path',
        default='none (`./.env` when present)',
        meaning=('An env file with any of the settings above; a named file that does not exist'
                 ' is an error.')),
    Setting(
        'CDR_BLAS_THREADS', 'process',
        type='int ≥ 0',
        default='`1`',
        meaning=('BLAS threads per request thread (0 leaves BLAS alone). One: BLAS threads '
                 'fighting over 2 cores cut 32-client throughput from 35 to 7.7 req/s.')),
    Setting(
        'CDR_RATE_LIMITS', 'process',
        type='`scope=N/period[;scope=N/period]`',
        default='none (no limits)',
        meaning=('Per-key rate limits per scope (`generate`, `admin`; `dev` for dev mode\'s '
                 'callers, counted by address), e.g. `generate=60/minute;admin=600/minute`; '
                 'over the limit: 429 with `Retry-After` ([deploy](../deploy.md#rate-limits)).'
                 )),
    Setting(
        'CDR_RATE_LIMIT_STORAGE', 'process',
        type='`limits` storage URI',
        default='`memory://` (per process)',
        meaning=('Where the rate-limit counters live; `redis://host:6379` shares them between '
                 'workers and replicas.')),
    Setting(
        'CDR_EMBEDDER', 'library',
        type='`minilm` or `openai:<model>@<base_url>`',
        default='`minilm`',
        meaning='The embedding model of `cdr ingest` and `cdr ckf ...` (`--embedder`).'),
    Setting(
        'CDR_EMBED_API_KEY', 'library',
        type='secret',
        default='none',
        meaning='API key of a remote (OpenAI-compatible) embedder.'),
    Setting(
        'CDR_EMBED_BASE_URL', 'library',
        type='URL',
        default='`https://api.openai.com/v1`',
        meaning='Base URL of a remote embedder named `openai:<model>` without `@<base_url>`.'),
    Setting(
        'CDR_STORE_REMOTE', 'library',
        type='`1` or unset',
        default='unset',
        meaning='Set to `1` to let a `qdrant+http://` or `qdrant+https://` knowledge base '
                'address name a host other than loopback (`cdr.stores.qdrant`); unset, only '
                '127.0.0.1, ::1 and localhost are opened.'),
    Setting(
        'CDR_EMBED_THREADS', 'library',
        type='int ≥ 1',
        default='the CPUs this process may use, at most 8',
        meaning='Worker threads of the bundled numpy embedding model.'),
    Setting(
        'CDR_EMBED_CACHE', 'library',
        type='path of a directory',
        default='none (off)',
        meaning=('Keep the bundled model\'s vectors in `<dir>/embeddings.sqlite3`, keyed by the '
                 'model, its files, the code that computes them and the exact text, and reuse '
                 'them: a rebuilt CKF, a re-ingest or every worker and replica of a gateway on '
                 'one machine embeds a text once. Shared safely by concurrent processes on a '
                 'local disk; a file that cannot be used is a warning, never an error '
                 '([the embedding cache](../retrieval.md#the-embedding-cache)).')),
    Setting(
        'CDR_ROW_THREADS', 'library',
        type='int ≥ 1',
        default='`os.cpu_count()`',
        meaning=('Threads for the per-fact products of the ranking core and the float32 Phase 1'
                 ' scan (`cdr.retrieval.row_products`): fixed row blocks, so every score is'
                 ' bit-identical whatever the count. Products under 16,384 rows × vectors run'
                 ' inline on the calling thread.')),
    Setting(
        'CDR_INGEST_MAX_BYTES', 'library',
        type='int ≥ 1 (bytes)',
        default='268435456 (256 MiB)',
        meaning=('The largest file ingest reads (`cdr ingest`, the gateway\'s folder jobs): a '
                 'larger one is skipped and listed with its size, the rest are ingested. '
                 '`cdr ingest --max-file-mb` sets it for one run.')),
    Setting(
        'CDR_HTML_EXTRACTOR', 'library',
        type='`on`, or `off`/`0`/`false`/`no`',
        default='on (when trafilatura is installed)',
        meaning=("HTML ingest: trafilatura's main-content text decides which blocks of a page "
                 'are content (menus and boilerplate are dropped); off keeps every text block.'
                 " Part of an HTML file's content hash.")),
    Setting(
        'CDR_LOCAL_MODEL', 'library',
        type='path to a GGUF',
        default='the reference model in `$CDR_CACHE_DIR/llm/`',
        meaning='The model the `local` writer loads (any GGUF with a chat template).'),
    Setting(
        'CDR_LOCAL_N_CTX', 'library',
        type='int ≥ 256',
        default='`6144`',
        meaning="The `local` writer's context length in tokens."),
    Setting(
        'CDR_LOCAL_THREADS', 'library',
        type='int ≥ 1',
        default=('one per core (at most 8), or 1 when the 1-minute load already reaches the '
                 'core count'),
        meaning='llama.cpp threads for generation and prompt processing.'),
    Setting(
        'CDR_CACHE_DIR', 'library',
        type='path',
        default='`$XDG_CACHE_HOME/cdr`, else `~/.cache/cdr`',
        meaning='Where installed models, sample corpora and benchmark CKFs are kept.'),
    Setting(
        'CDR_TEST_PG_DSN', 'tests',
        type='`postgresql://` URL',
        default='none (the PostgreSQL tests skip)',
        meaning='A PostgreSQL server the tests may use; `.ci/run` starts one on loopback.'),
    Setting(
        'CDR_RAY_ADDRESS', 'tests',
        type='`HOST:PORT`',
        default='none (the Ray tests skip)',
        meaning='A Ray head the tests may use; `.ci/run` starts one on loopback.'),
    Setting(
        'CDR_ST_VENV', 'tests',
        type='path',
        default='`bench/.venv-st`',
        meaning=('A virtual environment with sentence-transformers, where '
                 '`bench/make_minilm_reference.py` computes the PyTorch reference embeddings.')),
    Setting(
        'CDR_CRP_VENV', 'tests',
        type='path',
        default='`bench/.venv-crp`',
        meaning=('A virtual environment with the published reference implementation '
                 '(`crprotocol`), which `bench/ranking.py` compares against.')),
)


def setting(name: str) -> Setting:
    """The entry for `name`; a KeyError says a variable has none."""
    for entry in SETTINGS:
        if entry.name == name:
            return entry
    raise KeyError(f"{name} is not a documented setting: add it to cdr.settings")


@overload
def env(name: str, default: str) -> str: ...
@overload
def env(name: str, default: None = None) -> str | None: ...


def env(name: str, default: str | None = None) -> str | None:
    """The variable's value now, or `default` when it is unset.

    Read at each call, not at import: tests set variables after cdr is imported, and a gateway
    worker's environment is completed by its parent before the app is built. A `CDR_*` name
    must be listed above (KeyError otherwise), so a new variable cannot go undocumented; other
    names (`XDG_CACHE_HOME`, a provider's `OPENAI_API_KEY`) are conventions cdr follows."""
    if name.startswith("CDR_"):
        setting(name)
    return os.environ.get(name, default)


def environment() -> dict[str, str]:
    """A copy of the whole environment, for a parser that takes a mapping (and can be given
    another one in tests) or a child process."""
    return dict(os.environ)


def export(values: Mapping[str, str], *, overwrite: bool = True) -> None:
    """Set variables in this process's environment for what it starts or imports next: the
    gateway's worker processes (each builds the app from the environment) and Ray's client
    (which reads its own `RAY_*` settings). `overwrite=False` keeps a value the user set."""
    for name, value in values.items():
        if name.startswith("CDR_"):
            setting(name)
        if overwrite:
            os.environ[name] = value
        else:
            os.environ.setdefault(name, value)


def cache_dir() -> Path:
    """`$CDR_CACHE_DIR`, else `$XDG_CACHE_HOME/cdr`, else `~/.cache/cdr`: installed models,
    sample corpora and built CKFs survive between runs instead of costing minutes each time."""
    base = env("CDR_CACHE_DIR")
    if base:
        return Path(base).expanduser()
    xdg = env("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "cdr"
