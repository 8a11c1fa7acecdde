"""The retrieval benchmark's second corpus: Linux system-call man pages (Debian `manpages-dev`).

Sixty documents of one shape — every page has NAME, SYNOPSIS, DESCRIPTION, RETURN VALUE,
ERRORS, … — so a task's sub-queries ("Errors", "Return value") match every other page's
sections just as well as its own. That is the knowledge base of many similar documents that
issue 21 is about, and it is a different genre from the Python docs of `bench/corpus.py`.

The package is fetched once with `apt-get download manpages-dev` into
`~/.cache/cdr/bench/manpages-dev/` and unpacked with `dpkg-deb -x`; each roff page of section 2
is rendered with groff (`-man -Tutf8`, no hyphenation, one line per paragraph) and turned into
Markdown: the NAME line gives the title, sections become `##` headings and subsections `###`.

The 60 pages (`PAGES`) and their split into 20 tuning and 40 report tasks (`TUNE`, `REPORT`)
were fixed from manpages-dev 6.03-2 before any arm was tuned and are written here; `select()`
recomputes the choice so a different package version is noticed, not silently measured.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cdr.cli.samples import cache_dir
from cdr.errors import NotFoundError

DEBIAN_PACKAGE = "manpages-dev"
MAN2 = Path("usr/share/man/man2")
N_PAGES = 60
N_TUNE = 20
MIN_SECTIONS, MAX_SECTIONS = 4, 12
# Paragraphs (a proxy for facts, known before ingest) a chosen page holds: enough for a
# dozen windows to run out of, few enough that one page does not dominate the corpus.
MIN_PARAGRAPHS, MAX_PARAGRAPHS = 15, 45
GROFF = ["groff", "-man", "-Tutf8", "-P-c", "-rLL=4000n", "-rHY=0", "-dAD=l"]
_SPACES = re.compile(r"[ \t]+")
_HEADING = re.compile(r"#{1,6} ")

# Fixed from manpages-dev 6.03-2 by `select()` (see its rule) before any tuning.
PAGES: tuple[str, ...] = (
    "accept", "clock_nanosleep", "close_range", "connect", "dup", "epoll_create",
    "epoll_wait", "execveat", "futimesat", "get_kernel_syms", "get_mempolicy", "getcpu",
    "getitimer", "getpriority", "getrandom", "getrusage", "getsockopt", "getunwind",
    "getxattr", "inotify_add_watch", "io_cancel", "io_destroy", "io_getevents", "io_setup",
    "io_submit", "ioctl_ficlonerange", "ioctl_fideduperange", "ioprio_set", "kill",
    "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self", "listen",
    "listxattr", "lookup_dcookie", "mbind", "memfd_secret", "migrate_pages", "mincore",
    "mkdir", "mknod", "mmap2", "pidfd_open", "pidfd_send_signal", "pipe", "pkey_alloc",
    "posix_fadvise", "pread", "process_vm_readv", "recvmmsg", "sendmmsg", "set_thread_area",
    "splice", "spu_create", "spu_run", "sync", "sysctl", "tee", "timer_getoverrun",
    "unlink",
)
TUNE: tuple[str, ...] = (
    "accept", "clock_nanosleep", "execveat", "futimesat", "get_kernel_syms",
    "get_mempolicy", "getitimer", "getrandom", "getunwind", "io_destroy", "io_submit",
    "landlock_add_rule", "landlock_restrict_self", "listen", "mknod", "mmap2", "pidfd_open",
    "pidfd_send_signal", "posix_fadvise", "recvmmsg",
)
REPORT: tuple[str, ...] = (
    "close_range", "connect", "dup", "epoll_create", "epoll_wait", "getcpu", "getpriority",
    "getrusage", "getsockopt", "getxattr", "inotify_add_watch", "io_cancel", "io_getevents",
    "io_setup", "ioctl_ficlonerange", "ioctl_fideduperange", "ioprio_set", "kill",
    "landlock_create_ruleset", "listxattr", "lookup_dcookie", "mbind", "memfd_secret",
    "migrate_pages", "mincore", "mkdir", "pipe", "pkey_alloc", "pread", "process_vm_readv",
    "sendmmsg", "set_thread_area", "splice", "spu_create", "spu_run", "sync", "sysctl",
    "tee", "timer_getoverrun", "unlink",
)


@dataclass(frozen=True)
class ManPage:
    """One system-call page as Markdown, with what a task needs from it."""

    name: str  # file stem, e.g. "pipe" (pipe.2.gz)
    title: str  # the NAME line, e.g. "pipe, pipe2 - create pipe"
    names: str  # "pipe, pipe2"
    description: str  # "create pipe"
    sections: tuple[str, ...]  # `##` headings after NAME, in page order
    paragraphs: int  # body paragraphs and code blocks outside NAME
    markdown: str

    @property
    def task(self) -> str:
        return f"Write a reference page about {self.names}: {self.description}"


def split_names(split: str) -> tuple[str, ...]:
    """The page names of a split ("tune", "report" or "all")."""
    return {"tune": TUNE, "report": REPORT, "all": PAGES}[split]


def tune_names(names: list[str] | tuple[str, ...], n_tune: int = N_TUNE) -> tuple[str, ...]:
    """The `n_tune` names with the smallest sha1 hex digest, in name order."""
    ranked = sorted(set(names), key=lambda n: hashlib.sha1(n.encode()).hexdigest())
    return tuple(sorted(ranked[:n_tune]))


# ------------------------------------------------------------------------ fetch and render


def package_dir(cache: str | os.PathLike[str] | None = None) -> Path:
    """The unpacked `manpages-dev` package (downloaded on first use); its version is in
    `VERSION` beside it."""
    root = Path(cache).expanduser() if cache is not None else cache_dir() / "bench" / DEBIAN_PACKAGE
    if (root / MAN2).is_dir() and (root / "VERSION").is_file():
        return root
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise NotFoundError(f"`{tool}` is needed to fetch Debian's {DEBIAN_PACKAGE}")
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run(["apt-get", "download", DEBIAN_PACKAGE], cwd=tmp,
                             capture_output=True, text=True, check=False, timeout=600)
        debs = sorted(Path(tmp).glob(f"{DEBIAN_PACKAGE}_*.deb"))
        if res.returncode != 0 or not debs:
            raise NotFoundError(f"could not download {DEBIAN_PACKAGE} with apt-get "
                                f"({res.stderr.strip()[-300:]}); run `apt-get update` first")
        version = subprocess.run(["dpkg-deb", "-f", str(debs[-1]), "Version"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        staging = root.with_name(root.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(staging)], check=True,
                       capture_output=True, timeout=600)
        (staging / "VERSION").write_text(version + "\n", encoding="utf-8")
        shutil.rmtree(root, ignore_errors=True)
        os.replace(staging, root)  # a half-unpacked tree is never mistaken for the cache
    return root


def package_version(root: Path) -> str:
    return (root / "VERSION").read_text(encoding="utf-8").strip()


def is_redirect(roff: str) -> bool:
    """A page that only sources another (`.so man2/pipe.2`): an alias, not a document."""
    lines = [ln for ln in roff.splitlines() if ln.strip() and not ln.startswith(('.\\"', "'\\\""))]
    return bool(lines) and lines[0].startswith(".so ")


def render(roff: str) -> str:
    """The page as groff lays it out: plain UTF-8 text, one line per filled paragraph."""
    if shutil.which("groff") is None:
        raise NotFoundError("groff is needed to render man pages (Debian: groff-base)")
    out = subprocess.run(GROFF, input=roff.encode(), capture_output=True, check=True,
                         timeout=120).stdout
    col = subprocess.run(["col", "-bx"], input=out, capture_output=True, check=True, timeout=120)
    return col.stdout.decode("utf-8", errors="replace")


# ------------------------------------------------------------------------ text to Markdown


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def heading_text(raw: str) -> str:
    """"RETURN VALUE" → "Return value": the pages shout their headings; a sub-query reads
    better (and embeds closer to prose) in sentence case. Mixed-case headings are kept."""
    s = _SPACES.sub(" ", raw.strip())
    return s[:1] + s[1:].lower() if s.isupper() else s


def _block_markdown(block: list[str]) -> str:
    """One blank-line separated block of body text as Markdown."""
    base = min(_indent(b) for b in block)
    first = block[0].strip()
    if len(block) == 1:
        text = _SPACES.sub(" ", first)
        return f"- {text[1:].strip()}" if text.startswith("•") else text
    rest = block[1:]
    deeper = all(_indent(r) > _indent(block[0]) for r in rest)
    if deeper and len(rest) == 1 and len(first) <= 60:
        # A tagged paragraph (`.TP`): the tag, then its text one indent deeper.
        return f"{_SPACES.sub(' ', first)}: {_SPACES.sub(' ', rest[0].strip())}"
    code = "\n".join(b[base:].rstrip() for b in block)
    return f"```\n{code}\n```"


@dataclass(frozen=True)
class Converted:
    title: str
    sections: tuple[str, ...]
    paragraphs: int
    markdown: str


def to_markdown(rendered: str) -> Converted:
    """Rendered page text (see `render`) → Markdown.

    Lines at column 0 are section headings (`##`), lines at indent 3 subsection headings
    (`###`); the first and last non-blank lines are groff's header and footer. The NAME
    section's text becomes the title (`#`) and is not repeated as a section."""
    lines = [ln.rstrip() for ln in rendered.splitlines()]
    body = [i for i, ln in enumerate(lines) if ln.strip()]
    if len(body) < 3:
        raise ValueError("not a man page: fewer than three lines of text")
    lines = lines[body[0] + 1: body[-1]]
    out: list[str] = []
    sections: list[str] = []
    title = ""
    current: str | None = None
    paragraphs = 0
    block: list[str] = []

    def flush() -> None:
        nonlocal title, paragraphs
        if not block:
            return
        if current == "NAME":
            title = _SPACES.sub(" ", " ".join(b.strip() for b in block))
        else:
            out.extend([_block_markdown(block), ""])
            paragraphs += 1
        block.clear()

    for ln in lines:
        if not ln.strip():
            flush()
            continue
        ind = _indent(ln)
        if ind == 0:
            flush()
            current = _SPACES.sub(" ", ln.strip())
            if current != "NAME":
                sections.append(heading_text(current))
                out.extend([f"## {sections[-1]}", ""])
            continue
        if ind == 3 and current != "NAME":
            flush()
            out.extend([f"### {heading_text(ln)}", ""])
            continue
        block.append(ln)
    flush()
    if not title:
        raise ValueError("no NAME section")
    md = f"# {title}\n\n" + "\n".join(out).rstrip() + "\n"
    return Converted(title, tuple(sections), paragraphs, md)


def split_title(title: str) -> tuple[str, str]:
    """"pipe, pipe2 - create pipe" → ("pipe, pipe2", "create pipe")."""
    names, sep, desc = title.partition(" - ")
    if not sep:
        names, sep, desc = title.partition(" — ")
    return names.strip(), desc.strip() or names.strip()


def read_page(path: Path) -> ManPage | None:
    """A page file (`*.2.gz`) as a `ManPage`, or None for an alias or an unreadable page."""
    raw = path.read_bytes()
    roff = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8", "replace")
    if is_redirect(roff):
        return None
    try:
        conv = to_markdown(render(roff))
    except (ValueError, subprocess.CalledProcessError):
        return None
    name = path.name.split(".")[0]
    names, desc = split_title(conv.title)
    return ManPage(name, conv.title, names, desc, conv.sections, conv.paragraphs, conv.markdown)


def all_pages(root: Path) -> list[ManPage]:
    """Every page of section 2 that is a document of its own: Debian ships an alias
    (`pipe2.2.gz` for `pipe.2.gz`) as a symbolic link or a `.so` page; both are left out."""
    files = [p for p in sorted((root / MAN2).glob("*.2*")) if not p.is_symlink()]
    pages = [read_page(p) for p in files]
    return [p for p in pages if p is not None]


def select(pages: list[ManPage], n: int = N_PAGES) -> list[ManPage]:
    """The benchmark's pages: 4–12 sections and 15–45 paragraphs, most sections first
    (ties by name), the first `n`."""
    ok = [p for p in pages if MIN_SECTIONS <= len(p.sections) <= MAX_SECTIONS
          and MIN_PARAGRAPHS <= p.paragraphs <= MAX_PARAGRAPHS]
    ok.sort(key=lambda p: (-len(p.sections), p.name))
    return ok[:n]


def from_markdown(name: str, markdown: str) -> ManPage:
    """A chosen page read back from the Markdown `to_markdown` wrote."""
    lines = markdown.splitlines()
    title = lines[0].removeprefix("# ").strip()
    sections = tuple(ln[3:].strip() for ln in lines if ln.startswith("## "))
    body = markdown.split("\n\n")
    paragraphs = sum(1 for b in body if b.strip() and not _HEADING.match(b.lstrip()))
    names, desc = split_title(title)
    return ManPage(name, title, names, desc, sections, paragraphs, markdown)


def corpus_dir(cache: str | os.PathLike[str] | None = None) -> tuple[Path, str, list[ManPage]]:
    """(Markdown directory, package version, chosen pages): the chosen pages written as
    `<name>.md` under `~/.cache/cdr/bench/manpages-md/` (rewritten only when they differ).

    Rendering every page takes minutes on a loaded machine, so a directory whose `CHOSEN`
    stamp names this package version and the fixed pages is read back as it is."""
    root = package_dir(cache)
    version = package_version(root)
    out = root.with_name("manpages-md")
    stamp = out / "CHOSEN"
    want = f"{version}\n" + "\n".join(PAGES) + "\n"
    if PAGES and stamp.is_file() and stamp.read_text(encoding="utf-8") == want:
        return out, version, [from_markdown(n, (out / f"{n}.md").read_text(encoding="utf-8"))
                              for n in PAGES]
    chosen = select(all_pages(root))
    if PAGES and tuple(sorted(p.name for p in chosen)) != PAGES:
        raise NotFoundError(
            f"{DEBIAN_PACKAGE} {version} yields other pages than the fixed set (6.03-2); "
            "the benchmark's tasks would not be the ones tuned and reported")
    out.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    keep = set()
    for p in chosen:
        f = out / f"{p.name}.md"
        keep.add(f.name)
        if not f.is_file() or f.read_text(encoding="utf-8") != p.markdown:
            f.write_text(p.markdown, encoding="utf-8")
    for f in out.glob("*.md"):
        if f.name not in keep:
            f.unlink()
    if PAGES:
        stamp.write_text(want, encoding="utf-8")
    return out, version, chosen
