"""The `cdr` command: ingest, inspect the CKF, generate, serve, benchmark."""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from cdr import settings
from cdr.cli.ckf import ckf_app, ingest_command
from cdr.cli.keys import keygen_command
from cdr.cli.models import models_app
from cdr.errors import CdrError
from cdr.options import FACE_DEFAULTS as D  # the library's defaults, profile FACES_PROFILE
from cdr.options import MAX_WINDOWS_LIMIT, OPTION_NAMES, meaning
from cdr.ranking import RANKING_MODES
from cdr.session import (
    CKF_EXHAUSTED,
    IN_PROGRESS,
    RUN_FAILED,
    UPSTREAM_ERROR,
)
from cdr.writers import DEFAULT_WRITER, WRITER_NAMES, Writer, build_writer, needs_model

app = typer.Typer(
    name="cdr",
    help="Coverage-Differential Retrieval: long documents over several LLM windows, "
    "without repetition (CRP-SPEC-024).",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, pwsh)
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
# Sections a `ckf-exhausted` run names as left (with why), before "and N more".
SECTIONS_LEFT_SHOWN = 10
out = Console()


def fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def _print_version(value: bool) -> None:
    if value:
        from cdr import __version__

        sys.stdout.write(f"cdr {__version__} (cdr-retrieval; implements CRP-SPEC-024)\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print the version and exit.")] = False,
) -> None:
    """Coverage-Differential Retrieval: long documents over several LLM windows, without
    repetition (CRP-SPEC-024)."""


app.command("ingest", help="Ingest documents into a CKF directory.")(ingest_command)
app.add_typer(ckf_app, name="ckf", help="Inspect and edit a CKF.")
app.command("keygen", help="Make a gateway API key and its CDR_API_KEYS entry.")(keygen_command)
app.add_typer(models_app, name="models", help="List and install the models cdr runs on.")


def _writer(name: str, base_url: str | None, model: str | None) -> Writer:
    """The `--writer` with its upstream from the options or the `CDR_LLM_*` environment."""
    model = model or settings.env("CDR_LLM_MODEL")
    if name in WRITER_NAMES and needs_model(name) and not model:
        raise CdrError(f"the {name} writer needs a model: --llm-model or CDR_LLM_MODEL")
    return build_writer(name, model=model,
                        base_url=base_url or settings.env("CDR_LLM_BASE_URL"))


def with_rule_options(command: Callable[..., None]) -> Callable[..., None]:
    """One `--<rule>` option per session rule of `cdr.options.OPTION_CHOICES`, with its help
    and the faces' default, appended to `command`'s own (which takes them as `**rules`): a
    rule added to the table is a flag of `cdr generate` with nothing retyped here."""
    sig = inspect.signature(command, eval_str=True)  # the own options' Annotated, evaluated
    own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=getattr(D, name),
                               annotation=Annotated[str | None, typer.Option(
                                   help=meaning(name))])
             for name in OPTION_NAMES]
    command.__signature__ = sig.replace(parameters=own + added)  # type: ignore[attr-defined]
    return command


@app.command()
@with_rule_options
def generate(
    task: Annotated[str, typer.Argument(help="What to write, e.g. 'A guide to asyncio tasks'.")],
    ckf: Annotated[str, typer.Option(
        "--ckf", envvar="CDR_CKF",
        help="CKF directory (made by `cdr ingest`), a Ray-served shard set "
             "ray://HOST:PORT/PATH, or a Qdrant collection qdrant:PATH?collection=NAME "
             "(docs/stores.md).")],
    outline: Annotated[Path | None, typer.Option(help="One sub-query per line.")] = None,
    # The run's options: defaults and help from cdr.options.RunOptions (`D`, the faces'
    # defaults: the profile is cdr.options.FACES_PROFILE), never retyped.
    windows: Annotated[int, typer.Option(help=meaning("max_windows"))] = D.max_windows,
    words: Annotated[int, typer.Option(help=meaning("words"))] = D.words,
    fit_windows: Annotated[bool, typer.Option(
        "--fit-windows",
        help="Raise --windows to the windows --words needs at --generation-tokens (0.577 "
             f"words a token), at most {MAX_WINDOWS_LIMIT}; never lowers it.")] = False,
    writer: Annotated[str, typer.Option(help=" | ".join(WRITER_NAMES),
                                        envvar="CDR_WRITER")] = DEFAULT_WRITER,
    ranking: Annotated[str, typer.Option(help=meaning("ranking"))] = D.ranking,
    min_relevance: Annotated[float | None, typer.Option(help=meaning("min_relevance"))
                             ] = D.min_relevance,
    mmr_lambda: Annotated[float, typer.Option(help=meaning("mmr_lambda"))] = D.mmr_lambda,
    context_tokens: Annotated[int, typer.Option(help=meaning("context_tokens"))
                              ] = D.context_tokens,
    generation_tokens: Annotated[int, typer.Option(help=meaning("generation_tokens"))
                                 ] = D.generation_tokens,
    sub_queries: Annotated[int, typer.Option(help=meaning("sub_queries"))] = D.sub_queries,
    llm_base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL.")] = None,
    llm_model: Annotated[str | None, typer.Option(help="Model name for LLM writers.")] = None,
    profile: Annotated[str | None, typer.Option(help=meaning("profile"))] = D.profile,
    trace: Annotated[Path | None, typer.Option(help="Write the trace JSON here.")] = None,
    report: Annotated[Path | None, typer.Option(help="Write an HTML run report here.")] = None,
    out_file: Annotated[Path | None, typer.Option("--out", help="Write the Markdown here "
                                                                "(default: stdout).")] = None,
    **rules: str | None,
) -> None:
    """Write a document over several windows from a CKF, with CDR ranking."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from cdr.cli.tables import window_table
    from cdr.trace import build_trace
    from cdr.window.cite import document_of
    from cdr.window.length import capacity_warning, run_length
    from cdr.window.loop import GenerationConfig, Generator

    if ranking not in RANKING_MODES:
        raise fail(f"--ranking must be one of {', '.join(RANKING_MODES)}, got {ranking!r}", 2)
    if not 1 <= windows <= MAX_WINDOWS_LIMIT:
        raise fail(f"--windows must be within 1..{MAX_WINDOWS_LIMIT}, got {windows}", 2)
    if not task.strip():
        raise fail("the task is empty", 2)
    if fit_windows:
        from cdr.window.length import fitted_windows

        try:
            windows = fitted_windows(words, generation_tokens, windows)
        except CdrError as exc:
            raise fail(f"{exc} (--fit-windows)", 2) from None
    from cdr.options import resolve_options

    try:
        resolve_options(profile, **rules)
        chosen: dict[str, Any] = dict(rules)  # each a str or None, as GenerationConfig takes
    except CdrError as exc:
        flags = "/".join(f"--{n}" for n in ("profile", *OPTION_NAMES))
        raise fail(f"{exc} ({flags})", 2) from None
    outline_text = None
    if outline is not None:
        try:
            outline_text = outline.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise fail(f"cannot read outline {outline}: {exc}", 2) from None
    from cdr.knowledge_base import check_index_address

    try:
        check_index_address(ckf)
    except CdrError as exc:  # a malformed ray:// address: one plain line, exit 2, as `serve`
        sys.stderr.write(f"error: {' '.join(str(exc).split())}\n")
        raise typer.Exit(2) from None
    try:
        from cdr.knowledge_base import open_fact_index

        store = open_fact_index(ckf)
    except CdrError as exc:
        raise fail(str(exc)) from None
    # Closed however the command ends: an in-process caller (a notebook, a test) would
    # otherwise hold the SQLite connection until a garbage collection, and the WAL files
    # would come and go under it at that unforeseeable moment.
    try:
        try:
            config = GenerationConfig(
                max_windows=windows, words=words, sub_queries=sub_queries, ranking=ranking,
                min_relevance=min_relevance, mmr_lambda=mmr_lambda, context_tokens=context_tokens,
                generation_tokens=generation_tokens, profile=profile, **chosen,
            )
            gen = Generator(store, _writer(writer, llm_base_url, llm_model), config)
            session = gen.start(task, outline_text)
            short = capacity_warning(words, windows, generation_tokens)
            if short is not None:  # the length contract cannot hold: say so before the windows
                err.print(f"[bold yellow]warning:[/] {short}")
        except CdrError as exc:
            headers = getattr(exc, "headers", None)
            if headers:
                err.print(", ".join(f"{k}: {v}" for k, v in headers.items()))
            raise fail(str(exc)) from None

        events = []
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total} windows"), TimeElapsedColumn(),
                      console=err, transient=False) as progress:
            bar = progress.add_task(f"writing ({ranking})", total=windows)
            try:
                for event in gen.run(task, session=session):
                    events.append(event)
                    progress.update(bar, advance=1, description=(
                        f"window {event.number}: {len(event.prepared.envelope)} facts, "
                        f"completeness {event.completeness:.2f}"))
            except CdrError as exc:
                err.print(f"[bold red]error:[/] {exc}")
                if session.status == IN_PROGRESS:
                    session.status = RUN_FAILED
        err.print(window_table(events, f"{task} — ranking {ranking}"))
        document = document_of(session, events, [sq.text for sq in session.sub_queries])
        if trace is not None:
            trace.write_text(json.dumps(build_trace(session, events), indent=2), encoding="utf-8")
        if report is not None:
            from cdr.report import render_report

            report.write_text(render_report([build_trace(session, events)]), encoding="utf-8")
        if out_file is not None:
            out_file.write_text(document, encoding="utf-8")
        else:
            sys.stdout.write(document)
        last = events[-1].headers if events else {}
        delivered = run_length([sq.expected_words for sq in session.sub_queries],
                               [e.output for e in events])
        err.print(
            f"[bold]status:[/] {session.status}  completeness {session.completeness():.2f}  "
            f"windows {len(events)}/{windows}  {delivered.summary()}"
            + (f"  hint: {last['CRP-Onboarding-Hint']}" if "CRP-Onboarding-Hint" in last else "")
        )
        if session.status == CKF_EXHAUSTED and not delivered.within:
            err.print(f"the knowledge base grounded {delivered.delivered} of the {delivered.asked} "
                      "words asked: ingest more documents on the task for the rest")
        if session.status == CKF_EXHAUSTED:
            sent = {int(r) for e in events if e.output.strip() for r in e.prepared.rows}
            left = gen.sections_left(session, sent)
            for sq, unsent in left[:SECTIONS_LEFT_SHOWN]:
                why = ("no unsent fact of the knowledge base passes the relevance gate for it"
                       if not unsent else f"{unsent} unsent candidate(s) nearest to it are "
                       "below the novelty floor: what they say was already written")
                err.print(f"section left: {sq.text!r}: {why}", markup=False)
            if len(left) > SECTIONS_LEFT_SHOWN:
                err.print(f"… and {len(left) - SECTIONS_LEFT_SHOWN} more sections left")
        if session.status in (UPSTREAM_ERROR, RUN_FAILED):
            raise typer.Exit(1)
    finally:
        store.close()


@app.command("report")
def report_command(
    traces: Annotated[list[Path], typer.Argument(help="One trace JSON, or several to compare "
                                                      "side by side (e.g. CDR vs relevance).")],
    out: Annotated[Path, typer.Option("--out", help="The HTML file to write.")] = Path(
        "run.html"),
    label: Annotated[list[str] | None, typer.Option(
        help="A name per trace (default: its ranking mode).")] = None,
) -> None:
    """Write a self-contained HTML report of one or more traces (`generate --trace`)."""
    from cdr.report import write_report

    if len(traces) > 4:
        raise fail(f"at most 4 traces side by side, got {len(traces)}", 2)
    try:
        path = write_report(traces, out, label or None)
    except CdrError as exc:
        raise fail(str(exc), 2) from None
    err.print(f"report: {path}")


@app.command()
def serve(
    ckf: Annotated[str | None, typer.Option(
        help="CKF directory, or a Ray-served shard set ray://HOST:PORT/ABS_PATH.",
        envvar="CDR_CKF")] = None,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8088,
    kb: Annotated[list[str] | None, typer.Option(
        "--kb", help="A named knowledge base, NAME=PATH (a CKF directory or ray://...); "
                     "repeat for several. --ckf is the one named 'default'.")] = None,
    kb_config: Annotated[str | None, typer.Option(
        "--kb-config", envvar="CDR_KB_CONFIG",
        help="A TOML file listing knowledge bases: a kbs table of name = \"path\" lines.")] = None,
    workers: Annotated[int, typer.Option(
        min=1, help="Worker processes (each opens the KBs; sessions are shared through the "
                    "session store).")] = 1,
    log_level: Annotated[str, typer.Option(
        help="critical | error | warning | info | debug")] = "info",
    log_format: Annotated[str, typer.Option(
        help="text | json (one JSON object per line; one per request, with its id)")] = "text",
    root_path: Annotated[str, typer.Option(
        help="The path prefix a reverse proxy serves the gateway under (e.g. /cdr), "
             "for the links and API description it generates.")] = "",
) -> None:
    """Run the HTTP gateway (OpenAI-compatible relay and sidecar API)."""
    try:
        from cdr.gateway.app import serve as run_server
    except ImportError as exc:
        raise fail(f"the gateway is not available: {exc}") from None
    try:
        # a directory or ray://, parsed by settings
        run_server(ckf=ckf, host=host, port=port, kbs=kb, kb_config=kb_config,
                   workers=workers, log_level=log_level, log_format=log_format,
                   root_path=root_path)
    except CdrError as exc:
        if any(c.__name__ == "GatewayConfigError" for c in type(exc).__mro__):  # exit 2, usage
            sys.stderr.write(f"error: {' '.join(str(exc).split())}\n")
            raise typer.Exit(2) from None
        raise fail(str(exc)) from None


BENCHMARKS = ("ranking", "ingest", "quality", "gateway", "calibrate", "scale")


def checkout_bench_dir() -> Path | None:
    """The source checkout's bench/ when cdr runs from one (an editable install), else None:
    the benchmarks, their data and their reports are not part of the wheel."""
    root = Path(__file__).resolve().parents[3]  # src/cdr/cli/__init__.py -> the checkout
    bench_dir = root / "bench"
    return bench_dir if (root / "pyproject.toml").is_file() and bench_dir.is_dir() else None


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             hidden=checkout_bench_dir() is None)
def bench(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help=" | ".join(BENCHMARKS))],
) -> None:
    """Run a benchmark from the source checkout's bench/ (extra arguments are passed on)."""
    import subprocess

    bench_dir = checkout_bench_dir()
    if bench_dir is None:
        raise fail("`cdr bench` runs the benchmarks of a source checkout; this installation "
                   "is a package without them (clone the repository and run "
                   "`make bench` there)", 2)
    if name not in BENCHMARKS:
        raise fail(f"unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}", 2)
    script = bench_dir / f"{name}.py"
    if not script.is_file():
        raise fail(f"{script} not found in this checkout", 2)
    raise typer.Exit(subprocess.call([sys.executable, str(script), *ctx.args]))


def main() -> None:
    """Console entry point shared by `cdr` and `python -m cdr` (named `cdr` in both)."""
    app(prog_name="cdr")

