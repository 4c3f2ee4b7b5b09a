"""The /v1 routes declare response models, and a response that does not match its model is never sent."""

from __future__ import annotations

import pytest
from fastapi.routing import APIRoute
from starlette.requests import Request

from service.errors import ServiceError
from service.inference import check_response
from service.routes import v1
from service.schemas import NERResponse


def test_every_inference_route_declares_its_response_model():
    posts = [r for r in v1.routes if isinstance(r, APIRoute) and "POST" in r.methods]
    assert len(posts) == 10
    assert all(r.response_model is not None for r in posts), [r.path for r in posts if r.response_model is None]


def _request(route) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/v1/ner", "headers": [], "route": route,
                    "query_string": b""})


def test_a_response_that_drifts_from_its_schema_is_a_500_not_sent():
    route = next(r for r in v1.routes if isinstance(r, APIRoute) and r.response_model is NERResponse)
    entity = {"entity": "LOC", "text": "Paris", "start": 0, "end": 5, "score": 0.9}
    check_response(_request(route), {"model": "m", "results": [[entity]]})
    with pytest.raises(ServiceError, match="NERResponse"):
        check_response(_request(route), {"model": "m", "results": [[{**entity, "word": "Paris"}]]})
    with pytest.raises(ServiceError, match="NERResponse"):
        check_response(_request(route), {"model": "m", "results": [[{k: v for k, v in entity.items() if k != "end"}]]})
