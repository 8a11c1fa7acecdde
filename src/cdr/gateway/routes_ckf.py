"""CKF endpoints: upload documents (ingested in the background), job status, stats, delete."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import PurePosixPath, PureWindowsPath
from typing import Annotated, Any, Protocol, cast

from fastapi import APIRouter, File, Form, Path, Request, UploadFile
from fastapi.responses import JSONResponse

from cdr.gateway.app_state import Gateway
from cdr.gateway.errors import ApiError
from cdr.gateway.jobs import StagedFile
from cdr.gateway.kbs import kb_gateway
from cdr.gateway.paths import public_path, public_sources
from cdr.gateway.redact import scrub_paths
from cdr.gateway.schemas import Deleted, ErrorResponse, Job

# Mounted twice (`app.py`): under /v1/ckf for the default KB and under /v1/kbs/{kb}.
router = APIRouter(tags=["ckf"])
MAX_FILES = 100
MAX_NAME_BYTES = 255


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": ErrorResponse} for c in codes}


def _gw(request: Request) -> Gateway:
    """The KB this route serves (chosen by the router's dependency, `cdr.gateway.kbs`)."""
    return kb_gateway(request)


def _check_upload(name: str, data: bytes) -> str:
    """The file's kind (`cdr.ckf.kinds`), or a 415 (a type we do not read, or one whose extra
    is not installed: the message names it) / 422 (a file we cannot use)."""
    from cdr.ckf.kinds import available_suffixes, kind_for_suffix
    from cdr.ckf.sources import SkipDocument, parse_bytes

    suffix = PurePosixPath(name).suffix.lower()
    kind = kind_for_suffix(suffix)
    if kind is None:
        raise ApiError(415, f"{name}: unsupported file type {suffix or '(no extension)'!r}; "
                       f"supported: {', '.join(available_suffixes())}", param="file",
                       code="unsupported_file_type")
    if not kind.available:
        raise ApiError(415, f"{name}: {kind.missing()}", param="file",
                       code="unsupported_file_type")
    try:
        parse_bytes(data, kind.name)
    except SkipDocument as exc:
        raise ApiError(422, f"{name}: {exc}", param="file", code="unusable_document") from None
    return kind.name


def _clean_name(raw: str | None) -> str:
    """The base name of an upload, or a 422. Names are bounded by their UTF-8 bytes, not
    their characters: file systems count bytes (255 on ext4 and most others), so 250 × "é"
    is 250 characters but 500 bytes, and would fail only when written."""
    name = PureWindowsPath(PurePosixPath(raw or "").name).name.strip()
    if not name or name in (".", "..") or any(ord(c) < 32 for c in name):
        raise ApiError(422, f"upload has no usable file name ({raw!r}); the name's extension "
                       "says how to read it", param="file", code="invalid_file_name")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise ApiError(422, f"file name {name[:40]!r}… is {size} bytes in UTF-8; the limit "
                       f"is {MAX_NAME_BYTES} bytes", param="file", code="invalid_file_name")
    return name


@router.post("/documents", status_code=202, response_model=Job,
             responses=_errors(400, 404, 413, 415, 422),
             summary="Upload documents (.md, .txt, .html, .pdf); they are ingested in the "
                     "background: poll the job")
async def upload_documents(
    request: Request,
    file: Annotated[list[UploadFile], File(description="One or more files (repeat the field).")],
    source_type: Annotated[str, Form(max_length=64, description="Importance class: "
                                     "regulatory, official, peer-reviewed, internal, user, web."
                                     )] = "user",
    importance: Annotated[float | None, Form(gt=0, le=1, description="Overrides the source "
                                             "type's importance.")] = None,
) -> JSONResponse:
    from cdr.ckf.records import normalize_source_type

    gw = _gw(request)
    gw.kb.check_writable()
    if gw.kb.path is None:
        raise ApiError(409, "no CKF directory is configured: start the gateway with --ckf DIR "
                       "or CDR_CKF", code="no_ckf")
    if len(file) > MAX_FILES:
        raise ApiError(422, f"at most {MAX_FILES} files per upload, got {len(file)}",
                       param="file")
    stype = normalize_source_type(source_type)
    loop = asyncio.get_running_loop()
    checked: list[tuple[str, bytes, str]] = []
    seen: set[str] = set()
    for up in file:
        name = _clean_name(up.filename)
        if name in seen:
            raise ApiError(422, f"file name {name!r} appears twice in one upload",
                           param="file")
        seen.add(name)
        data = await up.read()
        kind = await loop.run_in_executor(None, _check_upload, name, data)
        checked.append((name, data, kind))
    staging = gw.jobs.staging_dir()
    try:  # from here the job owns the folder (and removes it when it ends); until then we do
        staged = []
        for name, data, kind in checked:
            path = staging / name
            try:
                path.write_bytes(data)
            except OSError as exc:  # e.g. a name this file system refuses
                raise ApiError(422, f"cannot stage file {name[:40]!r}: "
                               f"{exc.strerror or type(exc).__name__}", param="file",
                               code="invalid_file_name") from None
            staged.append(StagedFile(name, path, kind))
        job = gw.jobs.submit(staged, stype, importance)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return JSONResponse(_public_job(job.to_json()), status_code=202,
                        headers={"Location": f"{request.state.kb_prefix or '/v1/ckf'}"
                                            f"/jobs/{job.id}"})


@router.get("/jobs/{job_id}", response_model=Job, responses=_errors(404, 422),
            summary="An ingest job's status and report")
def get_job(request: Request,
            job_id: Annotated[str, Path(min_length=1, max_length=64)]) -> JSONResponse:
    return JSONResponse(_public_job(_gw(request).jobs.get(job_id).to_json()))


def _public_job(job: dict[str, Any]) -> dict[str, Any]:
    """A job as clients see it: sources and error text without server paths."""
    out: dict[str, Any] = public_sources(job)
    if isinstance(out.get("error"), str):
        out["error"] = scrub_paths(out["error"])
    return out


@router.get("/stats", summary="Facts, documents and storage of the CKF")
def stats(request: Request) -> JSONResponse:
    gw = _gw(request)
    index = gw.kb.latest()
    if index is None:
        return JSONResponse({"path": public_path(str(gw.kb.path)) if gw.kb.path else None,
                             "exists": False, "active_facts": 0, "documents": 0})
    return JSONResponse({"exists": True, **public_sources(index.stats())})


class _ListsDocuments(Protocol):
    """What both knowledge bases' indexes answer beyond `FactIndex` (a CKF snapshot; a
    Ray-served shard set, every shard's list merged): not part of the protocol the loop
    sees, since windows never list documents."""

    def documents(self) -> list[dict[str, Any]]: ...


@router.get("/documents", summary="Documents in the CKF")
def documents(request: Request) -> JSONResponse:
    index = cast("_ListsDocuments | None", _gw(request).kb.latest())
    return JSONResponse({"documents": public_sources(index.documents()) if index is not None
                         else []})


@router.delete("/documents/{doc_id}", response_model=Deleted, responses=_errors(404, 409, 422),
               summary="Delete a document (by id, or a unique id prefix of 6+ characters)")
async def delete_document(
    request: Request,
    doc_id: Annotated[str, Path(min_length=1, max_length=256)],
) -> JSONResponse:
    gw = _gw(request)
    gw.kb.check_writable()
    loop = asyncio.get_running_loop()
    try:  # found (NotFoundError -> 404) off the event loop, then deleted on the writer thread
        future = await loop.run_in_executor(None, gw.kb.delete_document, doc_id)
        found, removed = await asyncio.wrap_future(future)
    except (ValueError, OSError):  # not even a possible path or id (e.g. a NUL byte)
        raise ApiError(404, f"no document {doc_id!r} in the CKF") from None
    return JSONResponse({"id": found, "deleted": True, "facts_removed": removed})
