"""MkDocs hook: the benchmark results under `bench/results/` become the site's `results/`
pages, with their plots, without a second copy in the repository.

The benchmarks write their reports (Markdown with relative links to their PNGs) into
`bench/results/`, and the source and the README cite them there; copying them into `docs/`
would leave two versions to drift apart. So each `*.md` and image there is added to the build
as `results/<name>` (links between them keep working, and `--strict` checks them). A page
of `docs/results/` itself wins over a generated one of the same name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

# Where results live in the repository, and where they appear on the site.
RESULTS_SOURCE = "bench/results"
RESULTS_PAGES = "results"
SUFFIXES = (".md", ".png", ".svg", ".jpg")


def results_dir(config: Any) -> Path:
    return Path(config["config_file_path"]).resolve().parent / RESULTS_SOURCE


def on_files(files: Files, config: Any) -> Files:
    """Add every result page and plot (top level of `bench/results/` only: the run
    directories hold raw JSON, not pages)."""
    for path in sorted(results_dir(config).iterdir()):
        if not path.is_file() or path.suffix.lower() not in SUFFIXES:
            continue
        uri = f"{RESULTS_PAGES}/{path.name}"
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def _escape_reference_brackets(markdown: str) -> str:
    """`[a-z][0-9]` in a quoted text is a reference link to Markdown (and to mkdocstrings'
    cross-references, which fail the strict build on it). Result pages are reports, not
    hand-written pages, so such pairs are written as text: `][` becomes `]\\[` outside code,
    which renders the same."""
    out, fenced = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and "][" in line:
            parts = line.split("`")
            parts[::2] = [p.replace("][", "]\\[") for p in parts[::2]]
            line = "`".join(parts)
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri.startswith(f"{RESULTS_PAGES}/") and page.file.generated_by:
        return _escape_reference_brackets(markdown)
    return markdown
