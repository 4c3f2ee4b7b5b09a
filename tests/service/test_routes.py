"""The task routes are built from the task definitions' endpoints: one route per declared path, with the declared
response model and a request model of the declared name made of the endpoint's options, `model` and inputs; a
task's refusal is answered with 413 when it is more than the task takes (`TooLarge`), else 422, its message naming
the refusal's place in the request."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fastapi.routing import APIRoute
from pydantic import ValidationError

from service.errors import ErrorType, ServiceError
from service.handlers import HANDLERS, refusals_as_http, service_error, serving_limits
from service.requests import request_model
from service.routes import v1, v2
from service.schemas import RESPONSES
from service.settings import ServiceSettings
from tasks.common import InputTooLong, Refusal
from tasks.fill_mask import NoMask
from tasks.registry import DEFINITIONS, definition

ROUTES = {route.path: route for router in (v1, v2) for route in router.routes if isinstance(route, APIRoute)}
ENDPOINTS = [(task, endpoint) for task in DEFINITIONS.values() for endpoint in task.endpoints]


@pytest.mark.parametrize(("task", "endpoint"), ENDPOINTS, ids=[e.path for _, e in ENDPOINTS])
def test_every_declared_path_is_a_route_of_the_endpoint(task, endpoint):
    for path in (endpoint.path, *endpoint.also_at):
        route = ROUTES[path]
        assert route.methods == {"POST"} and route.summary == endpoint.summary
        assert route.response_model is RESPONSES[endpoint.response]
        assert route.name == endpoint.name
        body = route.dependant.body_params[0].field_info.annotation
        assert body is HANDLERS[endpoint.path].request_model and body.__name__ == endpoint.request
    if endpoint.kind in ("inputs", "similarity", "ranking"):
        options = endpoint.options or task.options
        assert set(options.model_fields) | {"model"} <= set(request_model(task, endpoint).model_fields)


def test_no_inference_route_but_the_declared_ones():
    declared = {path for _, e in ENDPOINTS for path in (e.path, *e.also_at)}
    posts = {path for path, route in ROUTES.items() if "POST" in route.methods}
    assert posts == declared


def test_an_inputs_request_takes_one_input_or_a_list_and_refuses_unknown_fields():
    qa = definition("qa")
    model = request_model(qa, qa.endpoints[0])
    one = model.model_validate({"inputs": {"question": "q", "context": "c"}, "top_k": 2})
    assert one.inputs.question == "q" and one.top_k == 2 and one.model is None
    assert len(model.model_validate({"inputs": [{"question": "q", "context": "c"}] * 2}).inputs) == 2
    with pytest.raises(ValidationError):
        model.model_validate({"inputs": {"question": "q", "context": "c", "answer": "a"}})
    with pytest.raises(ValidationError):
        model.model_validate({"inputs": "text", "doc_stride": 64})


def test_a_ranking_request_gives_the_task_its_documents_as_texts():
    rerank = definition("rerank")
    model = request_model(rerank, rerank.endpoints[0])
    body = model.model_validate({"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1, "priority": 3})
    assert (body.inputs.query, body.inputs.documents) == ("q", ["a", "b"])
    assert body.top_n == 1 and "inputs" not in model.model_fields


def test_a_refusal_is_the_http_error_its_status_says():
    assert service_error(Refusal("x: no")).error_type is ErrorType.VALIDATION
    assert service_error(InputTooLong(9, 8)).error_type is ErrorType.TOO_LARGE
    assert service_error(NoMask("no [MASK]")).error_type is ErrorType.VALIDATION
    with pytest.raises(ServiceError) as raised, refusals_as_http():
        definition("multiple-choice").check_input(None, SimpleNamespace(context="c", choices=["a"] * 65), None, 0)
    assert raised.value.error_type is ErrorType.TOO_LARGE and "choices: 65 given" in raised.value.message


@pytest.mark.parametrize(("field", "index", "message"), [
    ("layers", None, "layers: no such layer"),  # an option (or the inputs as a whole) by its name
    (None, 3, "inputs[3]: no such layer"),  # an input
    ("choices", 3, "inputs[3].choices: no such layer"),  # a field of an input
    (None, None, "no such layer"),  # the refusal names no place: its reason alone
])
def test_a_refusal_names_its_place_in_the_request(field, index, message):
    assert service_error(Refusal("no such layer", field, index)).message == message


def test_the_task_hooks_get_the_serving_caps_of_the_settings_as_numbers():
    limits = serving_limits(ServiceSettings(max_answer_length_cap=12, max_masks_per_input=3))
    assert (limits.max_answer_length_cap, limits.max_masks_per_input) == (12, 3)


def test_an_input_too_long_names_truncate_only_where_the_endpoint_has_it():
    classify, fill = HANDLERS["/v1/classify"], HANDLERS["/v1/fill-mask"]
    assert "send \"truncate\": true" in classify.refusal(InputTooLong(9, 8), "inputs[0]").message
    assert "truncate" not in fill.refusal(InputTooLong(9, 8), "inputs[0]").message
    bug = KeyError("not a refusal")
    assert classify.refusal(bug, "inputs[0]") is bug
