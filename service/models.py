"""The model repository: a folder of bundles, each checked, given an ONNX Runtime session, a batcher
and a warm-up, then served.

Bundles are verified with the shared loader (`tasks.bundle_checks.load_bundle`: manifest, format version,
sha256 of every file) before anything else happens, so a bad repository fails at start with the
file and the reason. Sessions come from the shared factory (`tasks.runtime.onnx_session.create_session`):
CUDA when present and fit for the bundle's precision, else the CPU with the configured intra-op threads.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
from tokenizers import Tokenizer

from service.batcher import Batcher, BatchPolicy, clip_buckets
from service.compute_slots import ComputeSlots
from service.errors import ErrorType, ServiceError
from service.metrics import Metrics
from service.settings import ServiceSettings
from tasks.bundle_checks import check_label_count, load_bundle
from tasks.definition import TaskDefinition
from tasks.engine import Engine, pass_shape, token_rows
from tasks.registry import definition
from tasks.runtime.bundle import (
    MODEL_FILE,
    TOKENIZER_FILE,
    Bundle,
    BundleError,
    external_data_locations,
    find_bundles,
    load_public_key,
)
from tasks.runtime.cpu import usable_cpus
from tasks.runtime.inference import BatchTable
from tasks.runtime.onnx_session import CUDA, create_session, per_token_output_bytes
from tasks.runtime.spec import TaskSpec
from tasks.runtime.tokenizer import CLS, SEP, UNK, EncodedInput, GilFreeTokenizer

log = logging.getLogger("berth.service.models")

class RepositoryError(RuntimeError):
    """The model repository cannot be served as configured (no bundles, a named one missing, a bad bundle)."""


class OnnxEngine:
    """One ONNX Runtime session: padded int64 feeds in, float32 outputs by name out.

    On CUDA it runs with I/O binding: inputs are copied to the device once and outputs are fetched
    once, instead of ORT staging every tensor through its own host buffers on each call.
    """

    def __init__(self, bundle: Bundle, intra_op_threads: int, prefer_gpu: bool, allow_spinning: bool = False,
                 model_bytes: bytes | None = None, spin_between_runs: bool = True):
        self.threads = intra_op_threads
        if model_bytes is None:
            model_bytes = verified_bytes(bundle, MODEL_FILE)  # the bytes hashed are the bytes ONNX Runtime loads
        self.session, self.provider = create_session(model_bytes, bundle.precision, intra_op_threads, prefer_gpu,
                                                     allow_spinning=allow_spinning,
                                                     spin_between_runs=spin_between_runs)
        self.input_names = [node.name for node in self.session.get_inputs()]
        self.output_names = list(definition(bundle.task).output_names)
        # The graph itself, not only its manifest: a format-1 manifest (no digest) may list labels it does not have.
        check_label_count(bundle, {o.name: list(o.shape) for o in self.session.get_outputs()},
                          f"bundle {bundle.path.name} (model.onnx)")
        self.io_binding = self.provider == CUDA

    @staticmethod
    def new_run_options() -> onnxruntime.RunOptions:
        """Fresh options for one pass: the batcher's watchdog sets `terminate` on them to stop that pass (its
        `session.run` then raises in the thread running it)."""
        return onnxruntime.RunOptions()

    def bytes_per_token(self) -> int:
        """Bytes a padded token adds to this session's per-token outputs (fill-mask's logits: 122,088)."""
        return per_token_output_bytes(self.session)

    def __call__(self, feeds: dict[str, np.ndarray], output_names: Sequence[str] | None = None,
                 run_options: onnxruntime.RunOptions | None = None) -> dict[str, np.ndarray]:
        """Run one pass; only `output_names` (default: all the task's outputs) are fetched from the session.
        `run_options`: this pass's own (`new_run_options`), so it can be terminated."""
        names = list(self.output_names if output_names is None else output_names)
        feeds = {name: feeds[name] for name in self.input_names}
        if self.io_binding:
            binding = self.session.io_binding()
            for name, value in feeds.items():
                binding.bind_cpu_input(name, value)
            for name in names:
                binding.bind_output(name, "cuda")
            self.session.run_with_iobinding(binding, run_options)
            values = binding.copy_outputs_to_cpu()
        else:
            values = self.session.run(names, feeds, run_options)
        return dict(zip(names, values))


@dataclass
class ServedModel:
    name: str
    bundle: Bundle
    spec: TaskSpec
    tokenizer: GilFreeTokenizer
    engine: OnnxEngine | None = None
    batcher: Batcher | None = None
    ready: bool = False
    load_seconds: float = 0.0
    warmup_shapes: list[tuple[int, int]] = field(default_factory=list)

    @property
    def task(self) -> str:
        return self.spec.task

    @functools.cached_property
    def task_engine(self) -> Engine:
        """The bundle's engine without sessions: the steps before and after the batcher runs the items."""
        return Engine(self.bundle, self.tokenizer)

    @property
    def definition(self) -> TaskDefinition:
        return definition(self.spec.task)

    @property
    def provider(self) -> str:
        return self.engine.provider if self.engine else "none"

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "task": self.task,
            "route": self.definition.route,
            "routes": [endpoint.describe() for endpoint in self.definition.endpoints],
            "labels": self.spec.labels,
            "problem_type": self.spec.problem_type,
            "max_seq_length": self.spec.max_seq_length,
            "precision": self.bundle.precision,
            "execution_provider": self.provider,
            "length_buckets": self.batcher.policy.buckets if self.batcher else [],
            "version_2_with_negative": (self.spec.version_2_with_negative
                                        if self.definition.answers_can_be_impossible else None),
            "ready": self.ready and (self.batcher is None or self.batcher.healthy),  # loaded, and not failing
            "examples": self.bundle.examples,
            "below_quality_floor": self.below_quality_floor,
            "batch_invariance": _invariance_summary(self.bundle.batch_invariance),
        }

    @property
    def below_quality_floor(self) -> bool:
        return bool(self.bundle.quality.get("below_floor", False))


def _invariance_summary(figures: dict[str, Any]) -> dict[str, Any] | None:
    """What export's batch-invariance gate measured (None: a bundle exported before the gate existed)."""
    if not figures:
        return None
    keys = ("max_abs_diff", "changed_answers", "changed_answers_per_1000", "examples", "batch_sizes",
            "batch_dependent", "threshold")
    return {key: figures.get(key) for key in keys}


def discover(settings: ServiceSettings) -> list[Bundle]:
    """The bundles to serve, verified (file hashes and manifest digest included). Raises RepositoryError
    naming the bundle and the problem.

    With `bundle_public_key` set, every bundle must carry a signature by that key (`berth sign-bundle`):
    an unsigned bundle, one signed by another key and one whose manifest changed after signing are
    refused. A model keeping tensors in external data files is refused too, even when its manifest lists
    them: the service gives ONNX Runtime model.onnx's verified bytes, and ONNX Runtime looks for the
    external data of a model loaded from bytes in the server's working directory, not in the bundle.
    """
    repository = Path(settings.models)
    if not repository.is_dir():
        raise RepositoryError(f"model repository {repository} is not a folder")
    public_key = None
    if settings.bundle_public_key is not None:
        try:
            public_key = load_public_key(settings.bundle_public_key)
        except BundleError as error:
            raise RepositoryError(f"bundle_public_key: {error}") from error
        except ImportError as error:
            raise RepositoryError(f"bundle_public_key needs the cryptography package (pip install 'berth[serve]'): "
                                  f"{error}") from error
    folders = find_bundles(repository)
    if settings.model_names:
        by_name = {folder.name: folder for folder in folders}
        missing = [name for name in settings.model_names if name not in by_name]
        if missing:
            raise RepositoryError(f"model(s) {missing} not found in {repository}; it holds {sorted(by_name)}")
        folders = [by_name[name] for name in settings.model_names]
    bundles = []
    for folder in folders:
        try:
            bundle = load_bundle(folder, verify_hashes=True, public_key=public_key)
        except BundleError as error:
            raise RepositoryError(f"bundle {folder.name}: {error}") from error
        if bundle.external_data:
            raise RepositoryError(
                f"bundle {folder.name}: {MODEL_FILE} keeps tensors in external data files "
                f"({', '.join(bundle.external_data)}); the service loads {MODEL_FILE} from its verified bytes, and "
                "ONNX Runtime would look for those files in the server's working directory, not in the bundle: "
                "export the model as one file")
        if definition(bundle.task).route is None:
            log.warning("bundle %s: task %s has no route in this service; not served", folder.name, bundle.task)
            continue
        bundles.append(bundle)
    if not bundles:
        raise RepositoryError(f"no servable bundle (a sub-folder with bundle.json) in {repository}")
    return bundles


def verified_bytes(bundle: Bundle, name: str) -> bytes:
    """A bundle file's bytes, read once and checked against the manifest's sha256: what is used is what
    was verified, even if the file changes on disk after discovery. The bytes of model.onnx are also
    checked to reference no external data file (see `discover`), so ONNX Runtime reads nothing else."""
    data = (bundle.path / name).read_bytes()
    if hashlib.sha256(data).hexdigest() != bundle.files[name].sha256:
        raise RepositoryError(f"bundle {bundle.path.name}: {name} changed since it was verified (sha256 differs "
                              "from bundle.json)")
    if name == MODEL_FILE:
        try:
            locations = external_data_locations(data)
        except BundleError as error:
            raise RepositoryError(f"bundle {bundle.path.name}: {name}: {error}") from error
        if locations:
            raise RepositoryError(f"bundle {bundle.path.name}: {name} keeps tensors in external data files "
                                  f"({', '.join(sorted(set(locations)))}), which the service does not load: "
                                  "export the model as one file")
    return data


def load_bundle_tokenizer(bundle: Bundle, shared: dict[str, GilFreeTokenizer] | None = None) -> GilFreeTokenizer:
    """The bundle's tokenizer; with `shared` (sha256 of tokenizer.json -> tokenizer), one object for every bundle
    whose file is byte for byte the same (~7 MiB each for a 30,522-word vocabulary). Sharing is safe: nothing
    changes a tokenizer after loading, and encoding only reads it (Rust `&self`), from any thread."""
    data = verified_bytes(bundle, TOKENIZER_FILE)  # checked against bundle.json whether shared or not
    digest = bundle.files[TOKENIZER_FILE].sha256
    if shared is not None and digest in shared:
        return shared[digest]
    tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    loaded = GilFreeTokenizer(tokenizer)
    if shared is not None:
        shared[digest] = loaded
    return loaded


def load_model(bundle: Bundle, settings: ServiceSettings, metrics: Metrics, intra_op_threads: int | None = None,
               compute_slots: ComputeSlots | None = None,
               tokenizers: dict[str, GilFreeTokenizer] | None = None) -> ServedModel:
    """Sessions, tokenizer and batcher for one verified bundle; warmed up when settings say so. `tokenizers`: the
    process's tokenizers by file digest, shared between bundles (load_bundle_tokenizer)."""
    started = time.perf_counter()
    name = bundle.path.name  # the folder name is the model name
    spec = bundle.spec()
    slots = compute_slots or ComputeSlots(usable_cpus())
    threads = (min(settings.intra_op_threads if intra_op_threads is None else intra_op_threads, slots.units)
               or slots.units)
    model_bytes = verified_bytes(bundle, MODEL_FILE)  # the bytes hashed are the bytes ONNX Runtime loads
    engine = OnnxEngine(bundle, threads, prefer_gpu=settings.device != "cpu", model_bytes=model_bytes,
                        **spinning(settings))
    if settings.device == "cuda" and engine.provider != CUDA and bundle.precision != "int8":
        raise RepositoryError(f"bundle {name}: device cuda was asked for, but the session runs on {engine.provider} "
                              "(is onnxruntime-gpu installed, and a GPU visible?)")
    narrow_engine, narrow_threads = narrow(engine, bundle, model_bytes, settings, slots)
    del model_bytes
    cuda = engine.provider == CUDA
    policy = pass_shape(
        clip_buckets(settings.length_buckets, spec.max_seq_length), cuda=cuda,
        max_batch_size=settings.max_batch_size,
        max_batch_tokens=settings.max_batch_tokens,
        pad_multiple=None if cuda else settings.pad_multiple,  # GPUs: few shapes; CPUs: few pads
        pass_tokens=settings.cpu_pass_tokens,
        bytes_per_token=engine.bytes_per_token(), output_bytes=settings.max_pass_output_bytes,
        shape=BatchPolicy,
        max_wait_s=settings.max_wait_ms / 1000,
        max_queue_items=settings.max_queue_items,
        min_retry_after_s=settings.retry_after_s,
        table=batch_table(settings.batch_table, name),
        max_consecutive_failures=settings.max_consecutive_failures,
        pipeline=settings.pipeline,
    )
    if spec.max_seq_length > settings.max_batch_tokens:
        raise RepositoryError(f"bundle {name}: max_seq_length {spec.max_seq_length} exceeds max_batch_tokens "
                              f"{settings.max_batch_tokens}; a full-length input could never run")
    batcher = Batcher(name, engine, policy, metrics, per_token=token_rows(definition(spec.task)), compute_slots=slots,
                      threads=threads, run_narrow=narrow_engine, narrow_threads=narrow_threads,
                      output_names=engine.output_names)
    model = ServedModel(name, bundle, spec, load_bundle_tokenizer(bundle, tokenizers), engine, batcher)
    metrics.register_model(name, spec.task, bundle.precision, engine.provider)
    if model.below_quality_floor:
        quality = bundle.quality
        log.warning("MODEL %s IS BELOW ITS QUALITY FLOOR: dev %s %s < %s; its answers are not to be trusted",
                    name, quality.get("metric"), quality.get("value"), quality.get("floor"))
    if settings.warmup:
        model.warmup_shapes = warm_up(model)
    model.load_seconds = time.perf_counter() - started
    return model


def narrow(engine: OnnxEngine, bundle: Bundle, model_bytes: bytes, settings: ServiceSettings, slots: ComputeSlots
           ) -> tuple[OnnxEngine | None, int]:
    """The engine for passes that run beside others (CPU only; on CUDA passes queue on the device) and its
    threads: the wide engine itself when it has as few threads already, else a second session of the same
    bytes on `cores // parallel_passes` threads."""
    parallel = settings.parallel_passes or slots.units
    if engine.provider == CUDA or parallel <= 1:
        return None, engine.threads
    threads = max(1, slots.units // parallel)
    if threads >= engine.threads:
        return engine, engine.threads
    return OnnxEngine(bundle, threads, prefer_gpu=False, model_bytes=model_bytes, **spinning(settings)), threads


def spinning(settings: ServiceSettings) -> dict[str, bool]:
    """OnnxEngine's spinning arguments: inside a pass with `ort_spin_in_pass`, also between passes with
    `ort_spinning`."""
    return {"allow_spinning": settings.ort_spinning or settings.ort_spin_in_pass,
            "spin_between_runs": settings.ort_spinning}


def batch_table(path: Path | None, model: str) -> BatchTable | None:
    """The measured batch-size table for a model: `path` itself (a file), or `<path>/<model>.json` (a folder,
    where a model without a file has none)."""
    if path is None:
        return None
    file = path / f"{model}.json" if path.is_dir() else path
    if not file.is_file():
        if path.is_dir():
            return None
        raise RepositoryError(f"batch_table {path}: no such file")
    try:
        return BatchTable.load(file)
    except (ValueError, KeyError, OSError) as error:
        raise RepositoryError(f"batch_table {file}: {error}") from error


def warm_up(model: ServedModel) -> list[tuple[int, int]]:
    """Run every length bucket once at its largest batch (largest first, so the memory arena grows
    once to its peak) and once at batch 1: later traffic meets no new shape and no new allocation."""
    assert model.batcher is not None
    policy = model.batcher.policy
    shapes = []
    nonfinite = 0
    for bucket in sorted(policy.buckets, reverse=True):
        largest = policy.batch_size_for(bucket)
        for batch in sorted({largest, 1}, reverse=True):
            item = filler_item(model, bucket)
            outputs = model.batcher.run_now([item] * batch)
            if model.batcher.parallel > 1:
                outputs += model.batcher.run_now([item] * batch, narrow=True)
            nonfinite += sum(isinstance(out, BaseException) for out in outputs)  # run_now raised the other errors
            shapes.append((batch, bucket))
    if nonfinite:
        log.error("model %s produced NaN or infinite outputs during warm-up (%d item(s)); its requests will fail "
                  "with 500 and its canary passes too, so it will turn not ready", model.name, nonfinite)
    return shapes


def filler_item(model: ServedModel, length: int) -> EncodedInput:
    """[CLS] [UNK]... [SEP] of `length` tokens (at least 2): the input of warm-up and canary passes."""
    length = max(2, length)
    cls_id, sep_id = model.tokenizer.token_to_id(CLS), model.tokenizer.token_to_id(SEP)
    filler = model.tokenizer.token_to_id(UNK)
    return EncodedInput([cls_id] + [filler] * (length - 2) + [sep_id], [0] * length, [(0, 0)] * length,
                        [None] * length, [None] * length, False)


def canary_item(model: ServedModel) -> EncodedInput:
    """The input of the model's canary passes (service/batcher.py): one item of its smallest warm-up shape, which
    it computed at start; without warm-up the shortest input there is, [CLS] [SEP]."""
    return filler_item(model, min((bucket for _, bucket in model.warmup_shapes), default=2))


def resolve_model(bundles: dict[str, Bundle], models: dict[str, ServedModel], name: str | None,
                  task: str, retry_after: int = 1) -> ServedModel:
    """The model a request names, or the route's default: the first model of the route's task by name.

    `bundles` are all the bundles being served, `models` those loaded so far. 404 for an unknown
    name, 422 naming the right route for a model of another task, 503 while it is still loading, and 503 while it
    is not ready (failing its forward passes, service/batcher.py), Retry-After the time to its next canary pass:
    whether or not the model is one /readyz waits for (ready_models), a request to it is refused, not failed.
    """
    if name is None:
        candidates = sorted(n for n, b in bundles.items() if b.task == task)
        if not candidates:
            raise ServiceError(ErrorType.NOT_FOUND, f"no {task} model is served here; served models: "
                               f"{_listing(bundles)}")
        name = candidates[0]
    bundle = bundles.get(name)
    if bundle is None:
        raise ServiceError(ErrorType.NOT_FOUND, f"unknown model {_shorten(name)!r}; served models: {_listing(bundles)}")
    if bundle.task != task:
        raise ServiceError(ErrorType.VALIDATION, f"model {name!r} is a {bundle.task} model; "
                           f"use POST {definition(bundle.task).route} (this route serves {task} models)")
    model = models.get(name)
    if model is None or not model.ready:
        raise ServiceError(ErrorType.OVERLOADED, f"model {name!r} is loading", status=503, retry_after=retry_after)
    batcher = model.batcher
    if batcher is not None and not batcher.healthy:
        raise ServiceError(ErrorType.OVERLOADED, f"model {name!r} is not ready: its forward passes are failing; a "
                           f"canary pass retries it every {batcher.policy.canary_interval_s:g} s", status=503,
                           retry_after=max(retry_after, math.ceil(batcher.next_canary_in())))
    return model


def _listing(bundles: dict[str, Bundle]) -> str:
    return ", ".join(f"{n} ({b.task})" for n, b in sorted(bundles.items())) or "none"


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
