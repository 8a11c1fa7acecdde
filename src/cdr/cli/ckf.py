"""`cdr ingest` and `cdr ckf ...`: the command-line face of the knowledge fabric.

Mounted by `cdr.cli` (`app.command("ingest")(ingest_command)`, `app.add_typer(ckf_app,
name="ckf")`); `app` here is the same pair, standalone, for tests (from a shell: `cdr ingest`,
`cdr ckf ...`).
Progress goes to stderr, results to stdout, errors to stderr with a non-zero exit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cdr.cli.ingest_progress import stage_progress
from cdr.errors import CdrError

out = Console()
err = Console(stderr=True)

CkfOption = Annotated[Path, typer.Option("--ckf", envvar="CDR_CKF", help="CKF directory.",
                                         show_default=False)]
EmbedderOption = Annotated[str | None, typer.Option(
    "--embedder", envvar="CDR_EMBEDDER",
    help="Embedding model: 'minilm' (default, offline, its float32 network on onnxruntime), "
         "'minilm-numpy' (the same model on numpy: the same vectors, slower), 'minilm-int8' "
         "(the same model with int8 weights on onnxruntime: its own embedding identity) "
         "or 'openai:<model>@<base_url>'.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
RecipeOption = Annotated[str | None, typer.Option(
    "--recipe",
    help="How facts are embedded: 'title-section-short' (with their document title and "
         "deepest heading, at most 10 tokens of them; the default for a new CKF), "
         "'title-section' (title and section path, at most 16 words) or 'plain' (the fact "
         "alone). An existing CKF keeps its own; change it with `cdr ckf reembed`.")]
# `cdr ingest` finished but left files out (each listed with its reason): distinct from 1
# (the ingest itself failed) and 2 (usage), so a script can tell "partly done" from "broken".
EXIT_SOME_SKIPPED = 3


@contextmanager
def _errors() -> Iterator[None]:
    """Known failures become one clear line and exit code 1 (2 for usage errors)."""
    try:
        yield
    except CdrError as e:
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except OSError as e:
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def _embedder(spec: str | None) -> Any:
    if spec is None:
        return None
    from cdr.retrieval.embed import get_embedder

    return get_embedder(spec)


def _open(path: Path, embedder: str | None = None) -> Any:
    from cdr.ckf import CKF

    return CKF.open(path, _embedder(embedder))


def ingest_command(
    paths: Annotated[list[Path], typer.Argument(help="Files or directories to ingest.",
                                                show_default=False)],
    ckf: CkfOption,
    source_type: Annotated[str, typer.Option(
        "--source-type", "-t",
        help="regulatory | official | peer-reviewed | internal | user | web "
             "(sets the importance weight).")] = "user",
    glob: Annotated[list[str] | None, typer.Option(
        "--glob", "--include", "-g",
        help="Only files matching this glob (repeatable), e.g. '*.md' or 'library/**'.")] = None,
    exclude: Annotated[list[str] | None, typer.Option(
        "--exclude", "-x", help="Skip files/directories matching this glob (repeatable).")
    ] = None,
    importance: Annotated[float | None, typer.Option(
        "--importance", help="Importance weight for this ingest, overriding the source type's.")
    ] = None,
    embedder: EmbedderOption = None,
    dtype: Annotated[str, typer.Option(
        "--dtype", help="Embedding storage for a new CKF: float32 or float16.")] = "float32",
    shards: Annotated[int | None, typer.Option(
        "--shards", help="Split into S shard CKFs (a shard set, served by Ray); documents are "
                         "placed by a stable hash of their path.")] = None,
    ray_address: Annotated[str | None, typer.Option(
        "--ray", help="Embed on this Ray cluster (GCS HOST:PORT, e.g. 127.0.0.1:6379) in "
                      "parallel tasks.")] = None,
    ray_workers: Annotated[int, typer.Option(
        "--ray-workers", help="Parallel embedding tasks with --ray (one BLAS thread each).")
    ] = 2,
    recipe: RecipeOption = None,
    max_file_mb: Annotated[float | None, typer.Option(
        "--max-file-mb", min=0.001,
        help="Skip (and list) files larger than this many MiB; default 256, or "
             "CDR_INGEST_MAX_BYTES.")] = None,
    follow_symlinks: Annotated[bool, typer.Option(
        "--follow-symlinks", help="Ingest files that links inside a folder point to outside "
                                  "it (refused and listed by default).")] = False,
    as_json: JsonOption = False,
) -> None:
    """Ingest documents (Markdown, text, HTML, PDF) into a CKF, creating it if needed.

    Only regular files are read: named pipes, devices and sockets are skipped and listed, as
    are files over the size limit and links that leave the folder (unless --follow-symlinks).

    Exit status: 0 all ingested (files that hold no fact, such as an empty page, are listed,
    not an error); 3 finished, but some files could not be ingested (listed with their
    reasons; the rest are ingested); 1 error; 2 usage error. Off a terminal, progress comes
    as plain lines on stderr every few seconds.
    """
    from cdr.ckf import CKF, ingest
    from cdr.ckf.records import check_importance, normalize_source_type
    from cdr.errors import NotFoundError

    with _errors():
        # Check what can be checked before a CKF is created or a model is loaded.
        source_type = normalize_source_type(source_type)
        if importance is not None:
            check_importance(importance)
        if recipe is not None:
            from cdr.retrieval.fact_recipe import check_recipe

            check_recipe(recipe)
        for p in paths:
            if not p.exists():
                raise NotFoundError(f"no such file or directory: {p}")
        from cdr.ckf.ingest import check_max_file_bytes

        limit = check_max_file_bytes(None if max_file_mb is None
                                     else max(1, round(max_file_mb * 2**20)))
        from cdr.cluster.shardset import is_shard_set, read_manifest

        if shards is None and is_shard_set(ckf):
            shards = read_manifest(ckf).n_shards
        model = _embedder(embedder)
        if ray_address is not None:
            from cdr.cluster.ray_ingest import RayEmbedder

            model = RayEmbedder(ray_address, workers=ray_workers, spec=embedder)
        if shards is not None:
            from cdr.cluster.shardset import ingest_sharded

            with stage_progress(err, disable=as_json) as progress:
                report = ingest_sharded(ckf, [str(p) for p in paths], shards, embedder=model,
                                        dtype=dtype, source_type=source_type,
                                        include=glob or None, exclude=exclude or None,
                                        importance=importance, progress=progress,
                                        recipe=recipe, max_file_bytes=limit,
                                        follow_symlinks=follow_symlinks)
        else:
            report = None
    if report is None:
        with _errors(), CKF.open_or_create(ckf, model, dtype=dtype, recipe=recipe) as index, \
                stage_progress(err, disable=as_json) as progress:
            report = ingest(index, [str(p) for p in paths], source_type=source_type,
                            include=glob or None, exclude=exclude or None,
                            importance=importance, progress=progress,
                            max_file_bytes=limit, follow_symlinks=follow_symlinks)
    if as_json:
        out.print_json(json.dumps(report.to_dict()))
    else:
        _print_report(report, ckf)
    if report.skipped:
        raise typer.Exit(EXIT_SOME_SKIPPED)


def _print_report(report: Any, ckf: Path) -> None:
    t = Table(title=f"Ingest into {ckf}", show_header=False)
    t.add_column("", style="bold")
    t.add_column("", justify="right")
    t.add_row("documents", f"{report.documents} ({report.documents_new} new, "
              f"{report.documents_changed} changed, {report.documents_unchanged} unchanged)")
    t.add_row("facts added", str(report.facts_added))
    t.add_row("facts kept", str(report.facts_kept))
    t.add_row("facts removed", str(report.facts_removed))
    t.add_row("texts embedded", str(report.embedded))
    t.add_row("skipped files", str(len(report.skipped)))
    if report.empty:
        t.add_row("files without a fact", str(len(report.empty)))
    if report.stale:
        t.add_row("stale documents", str(len(report.stale)))
    t.add_row("time", f"{report.seconds:.1f} s")
    if report.embedded and report.seconds > 0:
        t.add_row("rate", f"{report.embedded / report.seconds:,.1f} texts embedded/s")
    out.print(t)
    if report.skipped:
        out.print(f"[bold]Skipped files[/bold] ({len(report.skipped)}):")
        for path, reason in report.skipped[:50]:
            out.print(f"  {escape(path)}: [yellow]{escape(reason)}[/yellow]", highlight=False,
                      soft_wrap=True)
        if len(report.skipped) > 50:
            out.print(f"  ... {len(report.skipped) - 50} more (see --json)")
    if report.empty:
        out.print(f"[bold]Files without a fact[/bold] ({len(report.empty)}; nothing is wrong "
                  "with them, there is nothing to ingest):")
        for path, reason in report.empty[:10]:
            out.print(f"  {escape(path)}: {escape(reason)}", highlight=False, soft_wrap=True)
        if len(report.empty) > 10:
            out.print(f"  ... {len(report.empty) - 10} more (see --json)")
    if report.warnings:
        out.print(f"[bold]Warnings[/bold] ({len(report.warnings)}):")
        for path, warning in report.warnings[:50]:
            out.print(f"  {escape(path)}: {escape(warning)}", highlight=False, soft_wrap=True)
    if report.stale:
        out.print("[bold]No longer on disk[/bold] (marked STALE, still selectable):")
        for src in report.stale[:50]:
            out.print(f"  {src}", highlight=False, soft_wrap=True, markup=False)


ckf_app = typer.Typer(help="Inspect and edit a Contextual Knowledge Fabric (CKF).",
                      no_args_is_help=True)


@ckf_app.command("stats")
def stats_command(ckf: CkfOption, as_json: JsonOption = False) -> None:
    """Facts, documents, statuses, model and size of a CKF."""
    with _errors(), _open(ckf) as index:
        st = index.stats()
    if as_json:
        out.print_json(json.dumps(st))
        return
    t = Table(title=f"CKF {st['path']}", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    t.add_row("model", f"{st['model_id']} ({st['dim']}-d, {st['dtype']})")
    t.add_row("documents", f"{st['documents']} ({st['stale_documents']} stale)")
    t.add_row("active facts", f"{st['active_facts']} ({st['code_facts']} code)")
    t.add_row("facts by status", ", ".join(f"{k} {v}" for k, v in st["facts_by_status"].items()))
    t.add_row("rows", str(st["rows"]))
    t.add_row("active tokens", str(st["active_tokens"]))
    t.add_row("by source type",
              ", ".join(f"{k} {v}" for k, v in st["documents_by_source_type"].items()) or "-")
    t.add_row("size on disk", f"{st['size_bytes'] / 1e6:.1f} MB")
    t.add_row("updated", st["updated_at"])
    out.print(t)


@ckf_app.command("reembed")
def reembed_command(
    ckf: CkfOption,
    recipe: Annotated[str, typer.Option(
        "--recipe", help="The recipe to embed facts with: 'title-section-short', "
                         "'title-section' or 'plain'.")
    ] = "title-section-short",
    embedder: EmbedderOption = None,
    ray_address: Annotated[str | None, typer.Option(
        "--ray", help="Embed on this Ray cluster (GCS HOST:PORT, e.g. 127.0.0.1:6379) with "
                      "--ray-workers embedding actors.")] = None,
    ray_workers: Annotated[int, typer.Option(
        "--ray-workers", help="Embedding actors with --ray (one CPU each).")] = 2,
    as_json: JsonOption = False,
) -> None:
    """Re-embed every fact under another recipe (or, with --embedder, another model or path
    such as 'minilm-int8'), in place.

    Runs on every core of this machine, or on a Ray cluster with --ray. Readers keep the old
    vectors until the new ones commit. A killed run resumes where it stopped when run again;
    sessions started under the old identity are refused afterwards (their vectors are not
    comparable)."""
    from cdr.cluster.shardset import is_shard_set
    from cdr.retrieval.fact_recipe import check_recipe, describe

    with _errors():
        check_recipe(recipe)
        if ray_address is None:
            model = _embedder(embedder)
        else:  # the model loads in the actors, not here
            from cdr.cluster.ray_ingest import RayEmbedder

            model = RayEmbedder(ray_address, workers=ray_workers, spec=embedder)
        if is_shard_set(ckf):
            from cdr.cluster.shardset import reembed_shards

            def run(cb: Any) -> Any:
                return reembed_shards(ckf, recipe, embedder=model, progress=cb)
        else:
            def run(cb: Any) -> Any:
                from cdr.ckf.reembed import reembed

                with _open(ckf) as index:
                    return reembed(index, recipe, embedder=model, progress=cb)
        with stage_progress(err, disable=as_json) as progress:
            rep = run(lambda done, total: progress("re-embedding facts", done, total))
    if as_json:
        out.print_json(json.dumps(rep.__dict__))
        return
    if rep.unchanged:
        out.print(f"{ckf}: facts are already embedded that way ({describe(rep.model_id)})",
                  highlight=False, markup=False)
        return
    resumed = f", {rep.resumed_from} staged by an earlier run" if rep.resumed_from else ""
    out.print(f"{ckf}: {rep.rows} facts now embedded as {describe(rep.model_id)} "
              f"({rep.embedded} embedded by this run{resumed})", highlight=False, markup=False)


@ckf_app.command("search")
def search_command(
    query: Annotated[str, typer.Argument(help="Text to search for.", show_default=False)],
    ckf: CkfOption,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1)] = 10,
    min_relevance: Annotated[float, typer.Option("--min-relevance")] = -1.0,
    lexical: Annotated[str, typer.Option(
        "--lexical", help="off: cosine relevance | bm25: the cosine fused with BM25 of the "
                          "query's words, as sessions with `lexical: bm25` rank.")] = "off",
    embedder: EmbedderOption = None,
    as_json: JsonOption = False,
) -> None:
    """Top facts for QUERY by relevance (cosine, or fused with BM25), with section and source."""
    from cdr.retrieval.lexical import FusedIndex, lexical_index, session_terms
    from cdr.rules import rule

    lexical_modes = rule("lexical").choices

    if lexical not in lexical_modes:
        err.print(f"[red]error:[/red] --lexical must be one of {', '.join(lexical_modes)}, "
                  f"got {escape(repr(lexical))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    with _errors(), _open(ckf, embedder) as index:
        if lexical == "off":
            hits = index.search(query, limit=limit, min_relevance=min_relevance)
        else:  # cdr.retrieval.lexical: the loop's own fused Phase 1
            fused = FusedIndex(index, lexical_index(index), session_terms(query, []))
            sel = fused.select(index.embedder.encode([query])[0], min_relevance, limit)
            hits = list(zip(index.facts(sel.indices), sel.relevances.tolist(),
                            strict=True))
    if as_json:
        out.print_json(json.dumps([
            {"relevance": round(rel, 4), "fact_id": f.id, "row": f.row, "section": f.section,
             "source": f.source, "location": f.location, "is_code": f.is_code,
             "status": f.status.name, "content": f.content} for f, rel in hits]))
        return
    t = Table(title=f"Top {len(hits)} facts for {query!r}")
    t.add_column("rel", justify="right")
    t.add_column("section", overflow="fold", max_width=30)
    t.add_column("fact", overflow="fold")
    for f, rel in hits:
        snippet = " ".join(f.content.split())
        snippet = snippet if len(snippet) <= 240 else snippet[:237] + "..."
        where = f"{Path(f.source).name}:{f.location}"
        t.add_row(f"{rel:.3f}", f.section or "-", f"{snippet}\n[dim]{where}[/dim]")
    out.print(t)


@ckf_app.command("rm")
def rm_command(
    doc: Annotated[str, typer.Argument(help="Document id, source path or URL.",
                                       show_default=False)],
    ckf: CkfOption,
) -> None:
    """Delete a document; its facts are never selected again."""
    from cdr.cluster.shardset import delete_document, is_shard_set

    if is_shard_set(ckf):
        with _errors():
            shard, source, n = delete_document(ckf, doc)
        out.print(f"removed {source} from shard-{shard} ({n} facts no longer selectable)",
                  highlight=False, soft_wrap=True, markup=False)
        return
    with _errors(), _open(ckf) as index:
        source = index.document(doc)["source"]
        n = index.delete_document(doc)
    out.print(f"removed {source} ({n} facts no longer selectable)", highlight=False,
              soft_wrap=True, markup=False)


@ckf_app.command("docs")
def docs_command(ckf: CkfOption, as_json: JsonOption = False) -> None:
    """List the documents of a CKF (of a shard set: every shard's, with its shard)."""
    from cdr.cluster.shardset import is_shard_set, list_documents

    with _errors():
        if is_shard_set(ckf):
            docs = list_documents(ckf)
        else:
            with _open(ckf) as index:
                docs = index.documents()
    if as_json:
        out.print_json(json.dumps(docs))
        return
    t = Table(title=f"{len(docs)} documents")
    sharded = any("shard" in d for d in docs)
    for col in ("doc_id", "facts", "type", "importance", "status", "source"):
        t.add_column(col, overflow="fold")
    if sharded:
        t.add_column("shard")
    for d in docs:
        row = [d["doc_id"], str(d["n_facts"]), d["source_type"], f"{d['importance']:.2f}",
               d["status"], d["source"]]
        t.add_row(*row, *([str(d["shard"])] if sharded else []))
    out.print(t)


@ckf_app.command("check")
def check_command(ckf: CkfOption) -> None:
    """Verify that the database and the array files agree (exit 1 if not)."""
    with _errors(), _open(ckf) as index:
        problems = index.check()
    if problems:
        for p in problems:
            err.print(f"[red]problem:[/red] {p}", highlight=False)
        raise typer.Exit(1)
    out.print("ok")


@ckf_app.command("compact")
def compact_command(ckf: CkfOption) -> None:
    """Drop deleted facts from the arrays (renumbers rows; do it when no session is open)."""
    with _errors(), _open(ckf) as index:
        res = index.compact()
    out.print(f"rows: {res['rows_before']} → {res['rows_after']}")


@ckf_app.command("index")
def index_command(ckf: CkfOption) -> None:
    """Build or extend the int8 copy that makes Phase 1 `select` scan a quarter of the bytes
    (exact results). Every commit that adds rows extends it already once a store holds
    200,000 facts (`cdr.retrieval.scan.QUANT_MIN_ROWS`); run this for a smaller store, or to
    catch up at once. Incremental."""
    from cdr.retrieval.scan import HAVE_KERNELS, build_quantised

    with _errors(), _open(ckf) as index:
        n = build_quantised(index.path, index.epoch, index.embeddings)
    out.print(f"int8 copy covers {n} rows")
    if not HAVE_KERNELS:
        err.print("numba is not installed (pip install 'cdr-retrieval[fast]'): "
                  "select will not use it")


app = typer.Typer(no_args_is_help=True, help="cdr knowledge fabric commands.")
app.command("ingest")(ingest_command)
app.add_typer(ckf_app, name="ckf")
