"""Finding documents on disk and turning their bytes into text, or into a reason to skip them.

An ingest of a real directory meets images, stylesheets, binaries, empty files and text in
the wrong encoding. Each such file is skipped with a reason a person can act on, and the rest
of the ingest carries on.
"""

from __future__ import annotations

import codecs
import logging
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cdr import settings
from cdr.ckf.kinds import DocumentKind, document_kind, kind_for_suffix, parse
from cdr.ckf.records import ParsedDocument
from cdr.errors import InvalidInputError, NotFoundError

log = logging.getLogger("cdr.ckf")


class SkipDocument(Exception):
    """This document cannot be ingested; `str(exc)` says why."""


class EmptyDocument(SkipDocument):
    """This document holds no fact (no text, or less than one fact's worth): reported apart
    from the files that could not be ingested, since nothing is wrong with it. A real folder
    nearly always has a few (a stub page, an index with a title only)."""


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
    """A file to ingest; `root` is the directory it was found under (None if named directly);
    `refused`: why it is listed as skipped without being opened (None: read it)."""

    path: Path
    root: Path | None
    refused: str | None = None


OUTSIDE_LINK = ("a symbolic link to a file outside the folder ingested (to follow such links: "
                "--follow-symlinks)")


def discover(
    paths: Iterable[str | os.PathLike[str]],
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    follow_symlinks: bool = False,
) -> tuple[list[Candidate], list[Path]]:
    """Files to ingest, and the directories walked (used to notice vanished documents).

    Inside directories only known document types are considered (an HTML tree is full of
    images and stylesheets that are not worth a line in the report); hidden files and
    directories are left out. A file named explicitly is always tried. Globs match the path
    relative to the directory given; excluded directories are not entered.

    A symbolic link inside a folder that leads out of it (`notes.md -> ~/.aws/credentials`)
    is refused, listed with why, unless `follow_symlinks`: what a folder holds is what its
    owner put there, and a knowledge base is served to every key that reads it. Links to
    directories are not entered either way; a link named explicitly is the caller's choice.
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
        if not p.is_dir():  # a file, or a FIFO, device or socket `read_file` refuses
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
                if kind_for_suffix(Path(name).suffix) is None:
                    continue
                if inc and not glob_match(rel, inc):
                    continue
                if exc and glob_match(rel, exc):
                    continue
                fp = Path(dirpath) / name
                if fp not in seen:
                    seen.add(fp)
                    refused = None
                    if not follow_symlinks and fp.is_symlink() and not _inside(fp, p):
                        refused = OUTSIDE_LINK
                    files.append(Candidate(fp, p, refused))
    # In the order of their sources' names: the first document to bring a fact is then the
    # one whose source sorts first, the holder one CKF names as its source and embeds it
    # with, and the one a shard set keeps when several shards hold it (cdr.cluster.shard_view).
    files.sort(key=lambda c: str(c.path))
    return files, roots


def _inside(link: Path, root: Path) -> bool:
    """Whether `link` resolves to a path under `root` (a broken or looping link does not)."""
    try:
        return link.resolve(strict=True).is_relative_to(root)
    except (OSError, RuntimeError):
        return False


# ----------------------------------------------------------------------------- decoding

_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)


def kind_of(name: str, default: str | None = None) -> str:
    """The registered kind of a file by its suffix (`cdr.ckf.kinds`); `default` for a suffix
    the registry lacks, or SkipDocument when there is no default."""
    kind = kind_for_suffix(Path(name).suffix)
    if kind is not None:
        return kind.name
    if default is None:
        raise SkipDocument(f"unsupported file type {Path(name).suffix or '(no extension)'!r}")
    return default


# Codecs Python knows that are not character sets a page can be written in: a `<meta charset>`
# naming one is ignored (decoding HTML as punycode either raises something odd or yields junk).
_NOT_CHARSETS = frozenset({
    "punycode", "idna", "unicode_escape", "raw_unicode_escape", "utf_7", "undefined",
    "mbcs", "oem", "cp65001", "rot_13", "base64_codec", "hex_codec", "zlib_codec",
    "bz2_codec", "quopri_codec", "uu_codec",
})


def _declared_charset(data: bytes) -> tuple[str | None, str | None]:
    """(usable codec name, warning) for an HTML `<meta charset>` in the first 4 KB."""
    m = _CHARSET.search(data[:4096])
    if not m:
        return None, None
    label = m.group(1).decode("ascii", "replace")
    try:
        info = codecs.lookup(label)
    except LookupError:
        return None, f"unknown charset {label!r} declared; decoded as UTF-8"
    if info.name.replace("-", "_") in _NOT_CHARSETS or not getattr(
            info, "_is_text_encoding", True):
        return None, f"charset {label!r} declared is not a text encoding; decoded as UTF-8"
    return info.name, None


def decode_text(data: bytes, kind: str) -> tuple[str, list[str]]:
    """Bytes → (text, warnings), or SkipDocument naming what is wrong (empty, binary, bad
    encoding).

    HTML never fails on its charset: the declared one is used if it is a real text encoding
    that decodes the bytes, else UTF-8 if the bytes are valid UTF-8 (sniffed), else UTF-8 with
    U+FFFD for the bad bytes — each fallback with a warning. Markdown and text files have no
    way to declare a charset, so bytes that are not UTF-8 are refused with the offset of the
    first bad byte (a person can convert the file; guessing would ingest mojibake silently).
    """
    if not data:
        raise EmptyDocument("empty file")
    warnings: list[str] = []
    if data.startswith(b"\xef\xbb\xbf"):
        encoding = "utf-8-sig"
    elif data.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding = "utf-16"
    else:
        if b"\x00" in data[:8192]:
            raise SkipDocument("binary file (contains NUL bytes)")
        encoding = "utf-8"
    text: str | None = None
    if kind == "html" and encoding == "utf-8":
        declared, why = _declared_charset(data)
        if why:
            warnings.append(why)
        if declared:
            try:
                text = data.decode(declared)
            except (UnicodeError, ValueError, LookupError) as e:
                if declared != "utf-8":  # else the UTF-8 attempt below says it
                    warnings.append(f"bytes are not valid {declared} as declared "
                                    f"({type(e).__name__}); decoded as UTF-8")
        if text is None:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as e:
                text = data.decode("utf-8", errors="replace")
                warnings.append(f"not valid UTF-8 (first bad byte at offset {e.start}); bad "
                                "bytes replaced with U+FFFD")
    else:
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError as e:
            bad = data[e.start : e.start + 1].hex()
            raise SkipDocument(
                f"not valid {encoding.upper()} text (byte 0x{bad} at offset {e.start}); "
                "convert it to UTF-8"
            ) from None
    if not text.strip():
        raise EmptyDocument("empty file (whitespace only)")
    controls = sum(1 for ch in text[:4096] if ord(ch) < 32 and ch not in "\t\n\r\f\v")
    if controls > 0.05 * min(len(text), 4096):
        raise SkipDocument("binary file (mostly control characters)")
    return text, warnings


def decode(data: bytes, kind: str) -> str:
    """`decode_text` without the warnings (they are logged)."""
    text, warnings = decode_text(data, kind)
    for w in warnings:
        log.warning("%s", w)
    return text


def parse_bytes(data: bytes, kind: str) -> ParsedDocument:
    """Decode and parse; every failure is a SkipDocument with the reason. Warnings of the
    decoding and of the parser are in the document's `warnings`."""
    k = document_kind(kind)
    if k.binary:
        return _parse_binary(data, k)
    if not k.available:
        raise SkipDocument(k.missing())
    text, warnings = decode_text(data, kind)
    try:
        doc = parse(kind, text)
    except RecursionError:
        raise SkipDocument("document nesting too deep to parse") from None
    except (SkipDocument, InvalidInputError):
        raise
    except Exception as exc:  # a parser bug on one hostile file must not end the ingest
        raise SkipDocument(f"could not parse as {kind}: {type(exc).__name__}: {exc}") from None
    doc.warnings[:0] = warnings
    if not doc.blocks:
        raise EmptyDocument("no text content")
    return doc


def _parse_binary(data: bytes, k: DocumentKind) -> ParsedDocument:
    """A binary kind (PDF) parsed from its bytes, checked first by its header."""
    if not data:
        raise EmptyDocument("empty file")
    if k.magic and not data.lstrip().startswith(k.magic):
        raise SkipDocument(f"not a {k.label} (missing {k.magic.decode()} header)")
    if not k.available:
        raise SkipDocument(k.missing())
    assert k.parse_bytes is not None, k.name  # a binary kind registers its bytes parser
    try:
        doc = k.parse_bytes(data)
    except SkipDocument:
        raise
    except Exception as exc:
        raise SkipDocument(f"unreadable {k.label}: {exc}") from None
    if not doc.blocks:
        raise SkipDocument(k.no_text)
    return doc


# The largest file ingest reads unless told otherwise (`CDR_INGEST_MAX_BYTES`,
# `cdr ingest --max-file-mb`): larger than any manual, book or page set a person writes, small
# enough that one file cannot take a small machine's memory.
DEFAULT_MAX_FILE_BYTES = 256 * 1024 * 1024
_READ_CHUNK = 1 << 20
_SPECIAL = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
            (stat.S_ISDIR, "a directory"))


def max_file_bytes() -> int:
    """The size limit in force: `CDR_INGEST_MAX_BYTES`, else the default."""
    raw = settings.env("CDR_INGEST_MAX_BYTES")
    if raw is None or not raw.strip():
        return DEFAULT_MAX_FILE_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidInputError(f"CDR_INGEST_MAX_BYTES must be a whole number of bytes ≥ 1, "
                                f"got {raw!r}")
    return value


def _size(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n:,} bytes"


def _too_large(limit: int, what: str) -> SkipDocument:
    return SkipDocument(f"larger than the {_size(limit)} limit ({what}); raise it with "
                        "--max-file-mb or CDR_INGEST_MAX_BYTES")


def read_file(path: Path, limit: int | None = None) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (default `max_file_bytes()`),
    else `SkipDocument` saying why. The file is opened without blocking and checked on the
    open descriptor, so a FIFO, a device or a socket (or a file swapped for one after it was
    listed) is refused without waiting on it, and a file is read up to one byte past the
    limit, so a file that grows while read, or `/dev/zero` behind a link, is refused too."""
    limit = max_file_bytes() if limit is None else limit
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except PermissionError:
        raise SkipDocument("unreadable: permission denied") from None
    except IsADirectoryError:
        raise SkipDocument("is a directory") from None
    except OSError as e:
        raise SkipDocument(f"unreadable: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        for test, what in _SPECIAL:
            if test(st.st_mode):
                raise SkipDocument(f"not a regular file: {what}")
        if not stat.S_ISREG(st.st_mode):
            raise SkipDocument("not a regular file")
        if st.st_size > limit:
            raise _too_large(limit, _size(st.st_size))
        parts: list[bytes] = []
        got = 0
        try:
            while got <= limit:
                chunk = os.read(fd, min(_READ_CHUNK, limit + 1 - got))
                if not chunk:
                    break
                parts.append(chunk)
                got += len(chunk)
        except OSError as e:
            raise SkipDocument(f"unreadable: {e.strerror or e}") from None
        if got > limit:
            raise _too_large(limit, "it grew while read")
        return b"".join(parts)
    finally:
        os.close(fd)
