"""`GET /v1/models` and `GET /v1/models/{id}`: the knowledge bases a key may use, as OpenAI
models, so stock OpenAI clients and chat UIs that list models work unchanged. The default
KB is the model `cdr` (what the docs and examples send), every other KB `cdr/<name>`;
`cdr/default` names the default KB too. Picking one as `model` in a chat completion writes
from that KB (`routes_chat`); any other model is OpenAI's 404 `model_not_found`."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from cdr.gateway.kbs import KnowledgeBases
from cdr.gateway.settings import DEFAULT_KB

router = APIRouter(prefix="/v1/models", tags=["openai"])
DEFAULT_MODEL = "cdr"
MODEL_PREFIX = "cdr/"
_STARTED = int(time.time())


def model_id(kb: str) -> str:
    return DEFAULT_MODEL if kb == DEFAULT_KB else MODEL_PREFIX + kb


def kb_of_model(model: str) -> str | None:
    """The KB a model id names (`cdr`, `cdr/<name>`), or None for a model that is not ours."""
    if model == DEFAULT_MODEL:
        return DEFAULT_KB
    name = model.removeprefix(MODEL_PREFIX)
    return name if model.startswith(MODEL_PREFIX) and name else None


def model_not_found(model: str) -> Any:
    """OpenAI's answer for a model that does not exist, also for a KB the key does not
    reach (the two must not be told apart)."""
    from cdr.gateway.errors import ApiError

    return ApiError(404, f"the model {model[:100]!r} does not exist or you do not have access "
                    "to it", param="model", code="model_not_found")


def _model(kb: str) -> dict[str, Any]:
    return {"id": model_id(kb), "object": "model", "created": _STARTED, "owned_by": "cdr"}


@router.get("", summary="The knowledge bases this key may use, as models (`cdr`, `cdr/<name>`)")
def list_models(request: Request) -> JSONResponse:
    kbs: KnowledgeBases = request.app.state.kbs
    names = kbs.names_for(getattr(request.state, "api_key", None))
    return JSONResponse({"object": "list", "data": [_model(n) for n in names]})


@router.get("/{model:path}", summary="One model (`cdr`, `cdr/<name>`), if this key may use it")
def get_model(request: Request, model: str) -> JSONResponse:
    kbs: KnowledgeBases = request.app.state.kbs
    names = kbs.names_for(getattr(request.state, "api_key", None))
    name = kb_of_model(model)
    if name is None or name not in names:
        raise model_not_found(model)
    return JSONResponse(_model(name))
