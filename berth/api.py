"""berth as a library: load a bundle and call it in-process, exactly as its HTTP route answers.

    import berth

    classify = berth.load("models/sentiment")         # a bundle folder, or a bundle name in $BERTH_MODELS / models
    classify("A wonderful film.")                      # one input  -> its result
    classify(["Great.", "Dull."], top_k=2)             # a list     -> one result per input, in order

A `Model` runs the steps the service runs for the task's route (the route's own request model validates the
inputs and options, the route's adapter (service/handlers.py) checks and prepares them with the task layer, and
the bundle's engine (tasks/engine.py) runs the items in padded batches on ONNX Runtime and decodes them with the
route's decode), without HTTP, a queue or torch. The answer is the route's JSON as Python values (lists, dicts,
floats), so `model(x)` equals the `results` of `POST <route>` with `{"inputs": x}`. `Model.request(path, body)`
answers any route of the model's task with the route's whole response body (e.g. `/v1/embeddings` in OpenAI's
shape, `/v1/similarity`).

The service's per-request limits (inputs per request, characters, tokens) do not apply: a list of any length
is tokenized and run in batches. Caps on options (`max_answer_length_cap`, `max_masks_per_input`) are the
service's defaults. What the route refuses for what an input *is* (an empty text, a fill-mask
text without [MASK], an option out of range) raises `RequestError`, with the route's status and message.

`finetune(...)` and `export(...)` take the fields of `berth finetune` / `berth export`'s settings as keyword
arguments (the flags' names with underscores) and import torch only when called.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from export.settings import ExportSettings
    from tasks.runtime.bundle import Bundle
    from training.finetuning.settings import FinetuneSettings

__all__ = ["Model", "RequestError", "export", "finetune", "load"]

DEFAULT_REPOSITORY = "models"  # `berth serve`'s and `berth build-defaults`' default model repository
_NO_INPUT: Any = object()


class RequestError(ValueError):
    """An input or option the route refuses: `status` and `error_type` are what the HTTP route answers
    (422 validation, 413 too large...), the message is the route's `error` text."""

    def __init__(self, message: str, status: int = 422, error_type: str = "validation"):
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type


def find_bundle(path_or_name: str | os.PathLike[str], repository: str | os.PathLike[str] | None = None) -> Path:
    """The bundle folder `path_or_name` names: a folder holding bundle.json, else a bundle of that name in
    `repository` (default: $BERTH_MODELS, else ./models, as `berth serve` reads them). FileNotFoundError
    saying where it looked."""
    path = Path(path_or_name)
    if (path / "bundle.json").is_file():
        return path
    root = Path(repository if repository is not None else os.environ.get("BERTH_MODELS") or DEFAULT_REPOSITORY)
    named = root / str(path_or_name)
    if path.name == str(path_or_name) and (named / "bundle.json").is_file():
        return named
    raise FileNotFoundError(f"no bundle at {path} (a folder with bundle.json) nor a bundle named "
                            f"{str(path_or_name)!r} in {root}")


def load(path_or_name: str | os.PathLike[str], *, repository: str | os.PathLike[str] | None = None,
         threads: int = 0, verify: bool = True) -> Model:
    """Load a bundle for in-process inference on ONNX Runtime (CUDA when present and fit, else the CPU).

    `path_or_name`: a bundle folder, or the name of a bundle in `repository` (default: $BERTH_MODELS, else
    ./models). `threads`: ONNX Runtime's intra-op threads (0: the usable cores). `verify`: check the sha256 of
    every file against bundle.json first (as the service does)."""
    return Model(find_bundle(path_or_name, repository), threads=threads, verify=verify)


class Model:
    """A loaded bundle. Call it like its task's route: `model(inputs, **options)` (a ranking model:
    `model(query=..., documents=[...], **options)`)."""

    def __init__(self, folder: str | os.PathLike[str], *, threads: int = 0, verify: bool = True):
        from service.handlers import HANDLERS
        from service.models import ServedModel
        from service.settings import ServiceSettings
        from tasks.engine import Engine

        self.engine = Engine.load(folder, threads=threads, verify=verify)
        self.definition = self.engine.definition
        if not self.definition.endpoints:
            raise ValueError(f"{folder}: the {self.engine.spec.task} task has no route to answer as")
        engine = self.engine
        self._served = ServedModel(engine.bundle.path.name, engine.bundle, engine.spec, engine.tokenizer)
        self._handlers = {endpoint.path: HANDLERS[endpoint.path] for endpoint in self.definition.endpoints}
        # The route's checks of what an input is, without the per-request size limits (a list is run in batches)
        unbounded = 2**62
        self._limits = ServiceSettings(max_inputs_per_request=unbounded, max_chars_per_input=unbounded,
                                       max_chars_per_request=unbounded, max_tokens_per_request=unbounded,
                                       max_items_per_request=unbounded, max_response_bytes=unbounded,
                                       max_inflight_response_bytes=unbounded)

    @property
    def threads(self) -> int:
        """ONNX Runtime's intra-op threads."""
        return self.engine.threads

    @property
    def provider(self) -> str:
        """Where it runs: ONNX Runtime's CUDA or CPU execution provider."""
        return self.engine.provider

    @property
    def session(self) -> Any:
        """The ONNX Runtime session."""
        return self.engine.sessions[0]

    # -- what it is -----------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The bundle's name (its folder's), as the service names it."""
        return self._served.name

    @property
    def task(self) -> str:
        return self._served.spec.task

    @property
    def bundle(self) -> Bundle:
        """The verified manifest (tasks.runtime.bundle.Bundle): labels, max_seq_length, precision, metrics..."""
        return self._served.bundle

    @property
    def labels(self) -> list[str]:
        return list(self._served.spec.labels)

    @property
    def routes(self) -> list[str]:
        """The HTTP paths this model answers (its task's own first): what `request` takes."""
        return list(self._handlers)

    def __repr__(self) -> str:
        return f"<berth.Model {self.name!r} task={self.task} precision={self.bundle.precision} on {self.provider}>"

    # -- calling it -----------------------------------------------------------------------------------------

    def __call__(self, inputs: Any = _NO_INPUT, /, **options: Any) -> Any:
        """The task's own route: one input -> its result; a list -> one result per input, in order. The inputs
        and options are the route's request fields (`/docs` of a server, or `Model.routes`).

        A regression model's `score` is on the scale of the labels it was trained on, not a probability: the
        shipped `similarity` model (STS-B) answers 0 (unrelated) to 5 (the same meaning), and may pass either
        end a little."""
        path = self.routes[0]
        if self._handlers[path].endpoint.kind == "ranking":
            body = {**(inputs if inputs is not _NO_INPUT else {}), **options}
            return self.request(path, body)["results"]
        if inputs is _NO_INPUT:
            raise TypeError(f"{self.name}: give the inputs (a text, an input object or a list of them)")
        results = self.request(path, {"inputs": inputs, **options})["results"]
        return results if isinstance(inputs, list) else results[0]

    def request(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """The whole JSON answer of `POST path` with this request body, as Python values (a `model` field, when
        given, must be this model's name)."""
        import orjson

        handler = self._handlers.get(path) or self._handlers.get(_alias(self._handlers, path))
        if handler is None:
            raise RequestError(f"{self.name} ({self.task}) answers {', '.join(self.routes)}, not {path}", 404,
                               "not_found")
        if body.get("model") not in (None, self.name):
            raise RequestError(f"model {body['model']!r}: this is {self.name!r}", 404, "not_found")
        body = _validated(handler, body)
        results = self._answer(handler, body)
        shaped = handler.shape(self.name, results)
        return orjson.loads(orjson.dumps(shaped, option=orjson.OPT_SERIALIZE_NUMPY))

    def _answer(self, handler: Any, body: Any) -> list[Any]:
        """The route's checks and prepare, then the engine runs every item and decodes them with the route's decode."""
        from functools import partial

        from service.errors import ServiceError

        served, limits = self._served, self._limits
        inputs = body.inputs if isinstance(body.inputs, list) else [body.inputs]
        try:
            handler.check_inputs(inputs, limits)
            handler.check_body(body, limits)
            prepared = handler.prepare(served, inputs, body)
            handler.check_prepared(served, prepared, body, limits)
        except ServiceError as error:
            raise RequestError(error.message, error.status, error.error_type.value) from None
        return self.engine.answer(prepared, body, keep=handler.keep(served, body),
                                  finish=partial(handler.finish, served, body=body))


def _alias(handlers: Mapping[str, Any], path: str) -> str | None:
    """The main path of an endpoint also served at `path` (Cohere's /v2/rerank)."""
    return next((main for main, h in handlers.items() if path in h.endpoint.also_at), None)


def _validated(handler: Any, body: Mapping[str, Any]) -> Any:
    """The body through the route's own request model: the route's defaults, and its 422 message."""
    from pydantic import ValidationError

    from service.errors import clean_validation_detail, validation_message

    try:
        return handler.request_model.model_validate(dict(body))
    except ValidationError as error:
        raise RequestError(validation_message(clean_validation_detail(list(error.errors()))), 422,
                           "validation") from None


# -- training and export (import torch when called) ------------------------------------------------------------


def finetune(settings: FinetuneSettings | None = None, /, **fields: Any) -> dict[str, float]:
    """Fine-tune a head as `berth finetune` does: `fields` are its settings (FinetuneSettings,
    e.g. `task`, `train_file`, `dev_file`, `out`, `epochs`), or pass a FinetuneSettings. Returns the saved
    model's dev metrics (empty without dev data); the model folder is `out`."""
    from training.finetuning.finetune import run_finetune
    from training.finetuning.settings import FinetuneSettings

    if settings is None:
        settings = FinetuneSettings(**fields)
    elif fields:
        settings = settings.model_copy(update=fields)
    return run_finetune(settings)


def export(model_folder: str | os.PathLike[str] | ExportSettings, out: str | os.PathLike[str] | None = None,
           **fields: Any) -> Bundle:
    """Export a fine-tuned folder to a verified bundle as `berth export` does (ONNX graph, parity gate,
    bundle.json): `fields` are its settings (export.settings.ExportSettings: `precision`, `task`, `device`,
    `parity_examples`...), or pass an ExportSettings. Returns the bundle's manifest (`berth.load(out)` serves
    it)."""
    from export.bundle_builder import export_bundle
    from export.settings import ExportSettings, missing_input, out_refusal

    if isinstance(model_folder, ExportSettings):
        settings = model_folder.model_copy(update=fields)
    else:
        settings = ExportSettings(model_folder=Path(model_folder), out=Path(out) if out is not None else None,
                                  **fields)
    refused = out_refusal(settings.out, settings.force, "force=True")
    if refused:
        raise FileExistsError(refused)
    missing = missing_input(settings)
    if missing:
        raise FileNotFoundError(missing)
    examples = None
    if settings.examples:
        import json

        examples = json.loads(settings.examples.read_text(encoding="utf-8"))
    return export_bundle(settings, examples)
