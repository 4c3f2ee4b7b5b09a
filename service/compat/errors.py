"""Errors on text-embeddings-inference's routes, in TEI's shape.

TEI answers `{"error": str, "error_type": "Unhealthy" | "Backend" | "Overloaded" | "Validation" | "Tokenizer"}`
(its OpenAPI document's `ErrorResponse`; serde writes the enum's names as they are). berth's own shape has
the same two fields, so on these routes only `error_type` is translated, the status code is berth's, and
`detail` is left out. The app hands `error_response_for` to the request guard (service/middleware.py), which
answers its refusals (401, 408, 413, 429) through it: every error on a TEI route has TEI's shape, wherever it
is raised.

The Hugging Face Inference API's clients read `{"error": str}`, which berth's shape already is: its routes keep
berth's errors unchanged.
"""

from __future__ import annotations

import orjson
from fastapi.responses import JSONResponse

from service.errors import ServiceError, error_response

TEI_PATHS = frozenset({"/embed", "/embed_all", "/predict", "/rerank", "/tokenize", "/decode", "/info"})
HF_PREFIX = "/models/"
TEI_ERROR_TYPES = ("Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer")
FORWARDED_HEADERS = ("retry-after", "www-authenticate")


def tei_error_type(status: int, error_type: str) -> str:
    """TEI's error type for a berth error: 424 (the model cannot do this) is TEI's "Backend", a server that
    cannot serve now (503) "Unhealthy", the request's own problems (400, 401, 404, 408, 413, 422) "Validation",
    a full queue (429) "Overloaded", a failed or late answer (500, 504) "Backend"."""
    if status == 424:
        return "Backend"
    if status == 503:
        return "Unhealthy"
    if status == 408:  # the client's body did not arrive in time
        return "Validation"
    return {"overloaded": "Overloaded", "timeout": "Backend", "internal": "Backend"}.get(error_type, "Validation")


def error_response_for(path: str, error: ServiceError) -> JSONResponse:
    """The error response for `path`: TEI's shape on TEI's routes, berth's everywhere else."""
    if path not in TEI_PATHS:
        return error_response(error)
    body = {"error": error.message, "error_type": tei_error_type(error.status, error.error_type.value)}
    return JSONResponse(body, status_code=error.status, headers=error.headers())


def as_tei(response: JSONResponse) -> JSONResponse:
    """A berth error response (service/errors.py `response_for`) in TEI's shape."""
    body = orjson.loads(response.body)
    tei = JSONResponse({"error": body["error"], "error_type": tei_error_type(response.status_code, body["error_type"])},
                       status_code=response.status_code)
    for name in FORWARDED_HEADERS:
        if name in response.headers:
            tei.headers[name] = response.headers[name]
    return tei


def in_route_shape(path: str, response: JSONResponse) -> JSONResponse:
    """A berth error response for `path`, in TEI's shape on TEI's routes (e.g. routing's 405), else unchanged."""
    return as_tei(response) if path in TEI_PATHS else response
