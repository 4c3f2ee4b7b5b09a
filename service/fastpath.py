"""The inference routes' fast path: a POST with a JSON body to a /v1 inference route runs the route's own
endpoint without Starlette's routing and FastAPI's dependency and body machinery.

Under load that machinery was about a third of the event loop's time per request (py-spy, docs/SERVICE_RESULTS.md),
time the event loop then did not spend feeding the engine. Here the body, already in memory (the request guard
read it), is parsed by orjson and validated by pydantic, and the endpoint is called with it; its
errors go through the same mapping as FastAPI's exception handlers (service/errors.py). Everything else (other
methods, other content types, other paths) goes through FastAPI as before, and the endpoint is the same
function on both paths, so the two answer alike.
"""

from __future__ import annotations

import json
import typing

import orjson
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import response_for


class FastPath:
    """ASGI middleware in front of the app's router for the POST routes of `router` (and of `more` routers) whose
    endpoint is `(body, request)`."""

    def __init__(self, app: ASGIApp, router: APIRouter, *more: APIRouter):
        self.app = app
        self.routes: dict[str, tuple[APIRoute, type[BaseModel]]] = {}
        for route in (route for each in (router, *more) for route in each.routes):
            if isinstance(route, APIRoute) and route.methods == {"POST"}:
                body_model = typing.get_type_hints(route.endpoint).get("body")
                if isinstance(body_model, type) and issubclass(body_model, BaseModel):
                    self.routes[route.path] = (route, body_model)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if found is None or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        route, body_model = found
        scope["route"] = route  # the metrics' route label and the declared response model
        request = Request(scope, receive)
        try:
            body = _parse(body_model, await request.body())
            response = await route.endpoint(body, request)
        except Exception as error:  # noqa: BLE001 - every error is answered in the one JSON shape
            response = response_for(error, request)
        await response(scope, receive, send)


def _is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


def _not_utf8(raw: bytes) -> str | None:
    """What is wrong with a body that is not UTF-8 (orjson says "surrogates not allowed" of any such bytes)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return (f"the body is not UTF-8 (byte {raw[error.start]:#04x} at offset {error.start}); send JSON encoded "
                "as UTF-8, uncompressed")
    return None


def _parse(body_model: type[BaseModel], raw: bytes) -> BaseModel:
    """The body from its bytes, validated as FastAPI validates it (the parsed value, errors located under "body").

    orjson refuses an escaped unpaired surrogate ("\\ud800"), which is valid JSON; the standard parser takes it,
    so the route's own check answers it (naming the character) as on FastAPI's path. orjson also refuses what is
    nested more than 1,024 deep, which the standard parser may take or overflow on: a 400 either way."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the interpreter's stack allows
            raise RequestValidationError([{"type": "json_invalid", "loc": ("body",),
                                           "msg": f"Invalid JSON: {_not_utf8(raw) or error}"}]) from None
    try:
        return body_model.model_validate(value)
    except ValidationError as error:
        located = [{**e, "loc": ("body", *e["loc"])} for e in error.errors(include_url=False, include_input=False)]
        raise RequestValidationError(located) from None
