"""Finding documents on disk and turning their bytes into text, or into a reason to skip them.

An ingest of a real directory meets images, stylesheets, binaries, empty files and text in
the wrong encoding. Each such file is skipped with a reason a person can act on, and the rest
of the ingest carries on.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cdr.ckf.model import ParsedDocument
from cdr.ckf.parse import KIND_BY_SUFFIX, parse, parse_pdf, pdf_available
from cdr.errors import InvalidInputError, NotFoundError


class SkipDocument(Exception):
    """This document cannot be ingested; `str(exc)` says why."""


# ----------------------------------------------------------------------------- globs


@lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """gitignore-like glob: `*` and `?` stay within a path segment, `**` crosses them, and a
    pattern without "/" matches a file or directory name at any depth."""
    pat = pattern.strip().replace(os.sep, "/")
    anchored = "/" in pat.rstrip("/")
    pat = pat.strip("/")
    out = []
    i = 0
    while i < len(pat):
        c = pat[i]
        if pat.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pat.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = pat.find("]", i + 1)
            if j == -1:
                out.append(re.escape(c))
                i += 1
            else:
                body = pat[i + 1 : j].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    body = "".join(out)
    prefix = "" if anchored else "(?:.*/)?"
    return re.compile(f"^{prefix}{body}$")


def glob_match(relpath: str, patterns: Sequence[str]) -> bool:
    """True if `relpath` or one of its parent directories matches a pattern (a pattern naming
    a directory covers what is inside it)."""
    parts = relpath.strip("/").split("/")
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    return any(_glob_regex(p).match(x) for p in patterns for x in prefixes)


def _as_patterns(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    pats = [p for v in value for p in str(v).split(",") if p.strip()]
    for p in pats:
        if not p.strip():
            raise InvalidInputError("empty glob pattern")
    return [p.strip() for p in pats]


# ----------------------------------------------------------------------------- discovery


@dataclass(frozen=True, slots=True)
class Candidate:
    """A file to ingest; `root` is the directory it was found under (None if named directly)."""

    path: Path
    root: Path | None


def discover(
    paths: Iterable[str | os.PathLike[str]],
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
) -> tuple[list[Candidate], list[Path]]:
    """Files to ingest, and the directories walked (used to notice vanished documents).

    Inside directories only known document types are considered (an HTML tree is full of
    images and stylesheets that are not worth a line in the report); hidden files and
    directories are left out. A file named explicitly is always tried. Globs match the path
    relative to the directory given; excluded directories are not entered.
    """
    inc, exc = _as_patterns(include), _as_patterns(exclude)
    files: list[Candidate] = []
    roots: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        p = Path(raw).expanduser()
        if not p.exists():
            raise NotFoundError(f"no such file or directory: {raw}")
        p = p.resolve()
        if p.is_file():
            if p not in seen:
                seen.add(p)
                files.append(Candidate(p, None))
            continue
        roots.append(p)
        for dirpath, dirnames, filenames in os.walk(p):
            rel_dir = Path(dirpath).relative_to(p).as_posix()
            rel_dir = "" if rel_dir == "." else rel_dir + "/"
            dirnames[:] = sorted(
                d for d in dirnames
                if not d.startswith(".") and not (exc and glob_match(rel_dir + d, exc))
            )
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                rel = rel_dir + name
                if Path(name).suffix.lower() not in KIND_BY_SUFFIX:
                    continue
                if inc and not glob_match(rel, inc):
                    continue
                if exc and glob_match(rel, exc):
                    continue
                fp = Path(dirpath) / name
                if fp not in seen:
                    seen.add(fp)
                    files.append(Candidate(fp, p))
    return files, roots


# ----------------------------------------------------------------------------- decoding

_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)


def kind_of(name: str, default: str | None = None) -> str:
    kind = KIND_BY_SUFFIX.get(Path(name).suffix.lower(), default)
    if kind is None:
        raise SkipDocument(f"unsupported file type {Path(name).suffix or '(no extension)'!r}")
    return kind


def decode(data: bytes, kind: str) -> str:
    """Bytes → text, or SkipDocument naming what is wrong (empty, binary, bad encoding)."""
    if not data:
        raise SkipDocument("empty file")
    if data.startswith(b"\xef\xbb\xbf"):
        encoding = "utf-8-sig"
    elif data.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding = "utf-16"
    else:
        if b"\x00" in data[:8192]:
            raise SkipDocument("binary file (contains NUL bytes)")
        encoding = "utf-8"
        if kind == "html":
            m = _CHARSET.search(data[:4096])
            if m:
                declared = m.group(1).decode("ascii").lower()
                try:
                    "".encode(declared)
                    encoding = declared
                except LookupError:
                    pass
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as e:
        bad = data[e.start : e.start + 1].hex()
        raise SkipDocument(
            f"not valid {encoding.upper()} text (byte 0x{bad} at offset {e.start}); "
            "convert it to UTF-8"
        ) from None
    if not text.strip():
        raise SkipDocument("empty file (whitespace only)")
    controls = sum(1 for ch in text[:4096] if ord(ch) < 32 and ch not in "\t\n\r\f\v")
    if controls > 0.05 * min(len(text), 4096):
        raise SkipDocument("binary file (mostly control characters)")
    return text


def parse_bytes(data: bytes, kind: str) -> ParsedDocument:
    """Decode and parse; every failure is a SkipDocument with the reason."""
    if kind == "pdf":
        if not data:
            raise SkipDocument("empty file")
        if not data.lstrip().startswith(b"%PDF-"):
            raise SkipDocument("not a PDF (missing %PDF- header)")
        if not pdf_available():
            raise SkipDocument("PDF support needs pypdf: pip install 'cdr[pdf]'")
        try:
            doc = parse_pdf(data)
        except SkipDocument:
            raise
        except Exception as exc:
            raise SkipDocument(f"unreadable PDF: {exc}") from None
        if not doc.blocks:
            raise SkipDocument("PDF has no extractable text (scanned images?)")
        return doc
    text = decode(data, kind)
    try:
        doc = parse(kind, text)
    except RecursionError:
        raise SkipDocument("document nesting too deep to parse") from None
    if not doc.blocks:
        raise SkipDocument("no text content")
    return doc


def read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except PermissionError:
        raise SkipDocument("unreadable: permission denied") from None
    except IsADirectoryError:
        raise SkipDocument("is a directory") from None
    except OSError as e:
        raise SkipDocument(f"unreadable: {e.strerror or e}") from None
