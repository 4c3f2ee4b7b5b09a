"""What a task declares for serving: its endpoints as data (paths, kinds, input fields) and the refusals its
hooks raise, each saying which option, input or field it is about and why (no request path, no HTTP status), and
whether it is more than the task takes; the serving caps come as numbers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tasks.common import InputTooLong, Refusal, TooLarge
from tasks.definition import ENDPOINT_KINDS, Prepared, ServingLimits
from tasks.fill_mask import NoMask
from tasks.registry import DEFINITIONS, definition

ENDPOINTS = [(task, endpoint) for task in DEFINITIONS.values() for endpoint in task.endpoints]


def test_every_endpoint_path_is_declared_once_and_the_tasks_route_is_its_first():
    paths = [path for _, endpoint in ENDPOINTS for path in (endpoint.path, *endpoint.also_at)]
    assert len(paths) == len(set(paths))
    assert all(path.startswith(("/v1/", "/v2/")) for path in paths)
    for task in DEFINITIONS.values():
        assert task.route == (task.endpoints[0].path if task.endpoints else None)


@pytest.mark.parametrize(("task", "endpoint"), ENDPOINTS, ids=[e.path for _, e in ENDPOINTS])
def test_an_endpoint_names_its_schemas_and_a_kind_the_service_has(task, endpoint):
    assert endpoint.kind in ENDPOINT_KINDS
    assert endpoint.request.endswith("Request") and endpoint.response.endswith("Response")
    assert endpoint.summary and endpoint.description
    if endpoint.fields and endpoint.kind != "ranking":
        assert endpoint.input_object  # the schema name of one input object
    if endpoint.kind == "ranking":
        assert [f.name for f in endpoint.fields] == ["query", "documents"] and endpoint.fields[1].many
    if endpoint.kind == "similarity":
        assert [f.name for f in endpoint.fields] == ["source", "targets"]


def test_the_listing_describes_an_endpoint_as_plain_data():
    described = definition("rerank").endpoints[0].describe()
    assert described == {"path": "/v1/rerank", "kind": "ranking", "response": "RerankResponse",
                         "fields": [{"name": "query", "many": False}, {"name": "documents", "many": True}]}


def test_refusals_say_whether_the_input_is_more_than_the_task_takes():
    assert isinstance(InputTooLong(600, 512), TooLarge)
    assert isinstance(NoMask("no [MASK]"), Refusal) and not isinstance(NoMask("no [MASK]"), TooLarge)


def about(refusal: Refusal) -> tuple[str | None, int | None, str]:
    """What a refusal is about and why: (field, input index, reason)."""
    return refusal.field, refusal.index, str(refusal)


def test_multiple_choice_refuses_one_choice_and_too_many():
    task = definition("multiple-choice")
    with pytest.raises(Refusal) as one:
        task.check_input(None, SimpleNamespace(context="c", choices=["a"]), None, 2)
    assert about(one.value) == ("choices", 2, "1 given; a multiple-choice input needs at least 2")
    assert not isinstance(one.value, TooLarge)
    with pytest.raises(TooLarge) as many:
        task.check_input(None, SimpleNamespace(context="c", choices=["a"] * 65), None, 0)
    assert about(many.value) == ("choices", 0, "65 given; the limit is 64")
    task.check_input(None, SimpleNamespace(context="c", choices=["a", "b"]), None, 0)


def test_multiple_choice_refuses_one_choice_in_berth_predicts_words_too():
    task = definition("multiple-choice")
    assert task.input_refusal(SimpleNamespace(context="c", choices=["a"])) == (
        "choices", "1 choice(s); a multiple-choice input needs at least 2")
    assert task.input_refusal(SimpleNamespace(context="c", choices=["a", "b"])) is None


def test_qa_caps_max_answer_length_at_the_serving_limit():
    task = definition("qa")
    limits = ServingLimits(max_answer_length_cap=64, max_masks_per_input=1)
    task.check_options(task.options(max_answer_length=64), limits)
    with pytest.raises(Refusal) as refused:
        task.check_options(task.options(max_answer_length=65), limits)
    assert about(refused.value) == ("max_answer_length", None,
                                    "65 tokens; the limit is 64 (max_answer_length_cap)")


def test_fill_mask_refuses_more_masks_than_the_limit():
    task = definition("fill-mask")
    prepared = [Prepared([], (None, [1, 2], 0)), Prepared([], (None, [1, 2, 3], 0))]
    with pytest.raises(TooLarge) as refused:
        task.check_prepared(None, prepared, task.options(), ServingLimits(max_answer_length_cap=64,
                                                                          max_masks_per_input=2))
    assert about(refused.value) == (None, 1, "3 [MASK] tokens; the limit is 2 per input (max_masks_per_input)")


def test_embedding_refuses_layers_without_token_output_and_layers_the_model_lacks():
    task = definition("embedding")
    bundle = SimpleNamespace(encoder_config={"num_hidden_layers": 6})
    with pytest.raises(Refusal) as without:
        task.check_input(bundle, "text", task.options(layers=[-2]), 0)
    assert without.value.field == "layers" and str(without.value).startswith("only with")
    with pytest.raises(Refusal) as missing:
        task.check_input(bundle, "text", task.options(output="tokens", layers=[7]), 0)
    assert missing.value.field == "layers" and str(missing.value).startswith("layer 7 does not exist")
    with pytest.raises(TooLarge) as many:
        task.check_input(bundle, "text", task.options(output="tokens"), 16)
    assert many.value.field == "inputs" and many.value.index is None and "at most 16 inputs" in str(many.value)
    task.check_input(bundle, "text", task.options(output="tokens", layers=[-1, -2]), 15)
