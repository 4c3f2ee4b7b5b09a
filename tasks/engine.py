"""The one in-process engine: a bundle's inputs -> prepare -> run -> decode -> results.

The service (its batcher runs the items, service/inference.py), `berth predict` (a file a window at a time,
predict/run.py) and `berth.load` (berth/api.py) all answer through it; each adds only its own concern (HTTP
limits and wire formats; files, resume and lanes; a notebook's call).

    Engine.load(folder, threads, lanes)       the verified bundle, its tokenizer, task and ONNX Runtime sessions
    engine.prepare(inputs, options)           each input's model items (`InputFailed` names the first refused)
    engine.run(items, keep, shape)            each item's kept rows: planned batches, on the sessions side by side
    engine.decode(prepared, kept, options)    each input's items' outputs, then the task's decode
    engine.answer(prepared, options)          run and decode; `engine(inputs, options)`: all three

An Engine without sessions (`Engine(bundle, tokenizer)`) prepares and decodes for a runner elsewhere: the service's
batcher. The two rules every runner follows are stated here once: which outputs have a row per token
(`token_rows`) and how big one pass may be (`pass_shape`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tasks.bundle_checks import check_label_count, load_bundle
from tasks.definition import ItemOutputs, Prepared, TaskDefinition, per_input
from tasks.registry import definition
from tasks.runtime.bundle import MODEL_FILE, TOKENIZER_FILE, Bundle
from tasks.runtime.cpu import usable_cpus
from tasks.runtime.inference import PASS_OUTPUT_BYTES, BatchShape, Keep, ModelItem, Rows, run_items
from tasks.runtime.onnx_session import (
    CPU,
    CUDA,
    MemoryPolicy,
    choose_provider,
    create_session,
    onnx_runner,
    per_token_output_bytes,
    set_memory_policy,
)
from tasks.runtime.tokenizer import GilFreeTokenizer, load_tokenizer

# (prepared inputs, each input's item outputs) -> one result per input: a route's own decode (e.g. OpenAI's shape)
Finish = Callable[[list[Prepared], list[list[ItemOutputs]]], list[Any]]


def token_rows(task: TaskDefinition) -> bool | frozenset[str]:
    """The outputs of `task` that have a row per token, trimmed to each item's length so padding never reaches
    decoding: all of them (NER, QA, fill-mask), or the names of those that do (embedding's hidden states)."""
    return True if task.per_token else frozenset(task.token_outputs)


def pass_shape(buckets: Sequence[int], *, cuda: bool, max_batch_size: int, max_batch_tokens: int,
               pad_multiple: int | None, pass_tokens: int | None, bytes_per_token: int,
               output_bytes: int = PASS_OUTPUT_BYTES, shape: type[BatchShape] = BatchShape,
               **more: Any) -> BatchShape:
    """How big one pass may be: on the CPU at most `pass_tokens` padded tokens (a larger batch only adds latency
    there; a GPU takes what the budget allows), and on any device per-token outputs of at most `output_bytes`
    (`bytes_per_token`: what a padded token adds to the fetched outputs; 0: none are per token). `shape`: the
    class to build (the service's BatchPolicy adds the queue's limits, `more`)."""
    return shape(list(buckets), max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens,
                 pad_multiple=pad_multiple, pass_tokens=None if cuda or not pass_tokens else pass_tokens,
                 output_tokens=output_bytes // bytes_per_token if bytes_per_token else None, **more)


def items_of(prepared: Sequence[Prepared]) -> list[ModelItem]:
    """Every model item of the prepared inputs, input by input."""
    return [item for p in prepared for item in p.items]


class Engine:
    """A verified bundle's task, tokenizer and ONNX Runtime sessions (none: a runner elsewhere runs its items)."""

    def __init__(self, bundle: Bundle, tokenizer: GilFreeTokenizer, sessions: Sequence[Any] = (),
                 provider: str = CPU, threads: int = 0):
        self.bundle = bundle
        self.spec = bundle.spec()
        self.definition = definition(self.spec.task)
        self.tokenizer = tokenizer
        self.sessions = list(sessions)
        self.provider = provider
        self.threads = threads
        self.token_rows = token_rows(self.definition)
        self._lanes = ThreadPoolExecutor(len(self.sessions), thread_name_prefix="berth-engine-lane") \
            if len(self.sessions) > 1 else None

    @classmethod
    def load(cls, folder: str | Path, *, threads: int = 0, lanes: int = 1, verify: bool = True) -> Engine:
        """Load and check a bundle (`verify`: the sha256 of every file against bundle.json first) onto ONNX
        Runtime: CUDA when present and fit for its precision, else the CPU on `threads` threads (0: the usable
        cores). `lanes` sessions, sharing one copy of the weights, run passes side by side on threads // lanes
        threads each; 0: one a thread on the CPU (independent one-thread passes keep every core busy, where one
        pass on all threads waits on its slowest thread), one on CUDA."""
        bundle = load_bundle(folder, verify_hashes=verify)
        threads = threads or usable_cpus()
        cpu = choose_provider(bundle.precision) == CPU
        lanes = max(1, min(lanes or (threads if cpu else 1), threads))
        model_bytes = (bundle.path / MODEL_FILE).read_bytes()
        if lanes > 1:
            set_memory_policy(MemoryPolicy(share_weights=True))
        sessions, provider = [], CPU
        for _ in range(lanes):
            session, provider = create_session(model_bytes, bundle.precision, threads // lanes)
            sessions.append(session)
        del model_bytes
        # The graph itself, not only its manifest: a format-1 manifest (no digest) may list labels it does not have.
        check_label_count(bundle, {o.name: list(o.shape) for o in sessions[0].get_outputs()},
                          f"{folder} (model.onnx)")
        tokenizer = GilFreeTokenizer(load_tokenizer(bundle.path / TOKENIZER_FILE))
        return cls(bundle, tokenizer, sessions, provider, threads)

    @property
    def lanes(self) -> int:
        return len(self.sessions)

    # -- the steps ----------------------------------------------------------------------------------------------

    def prepare(self, inputs: Sequence[Any], options: Any) -> list[Prepared]:
        """Each input's model items, the list tokenized at once where the task can; `InputFailed` names the first
        input the task refuses."""
        return self.definition.prepare_many(self.tokenizer, self.spec, inputs, options)

    def keep(self, options: Any) -> Keep:
        """What each item keeps of its forward pass for `decode` with these options."""
        return self.definition.keep(self.tokenizer, self.spec, options)

    def shape(self, names: Sequence[str], max_batch_size: int = 64, pass_tokens: int = 1024) -> BatchShape:
        """Offline batches: up to `max_batch_size` items a pass, padded to the longest rounded up to 8 (the
        service's CPU padding), within `pass_shape`'s limits for fetching `names`."""
        length = self.spec.max_seq_length
        return pass_shape([length], cuda=self.provider == CUDA, max_batch_size=max_batch_size,
                          max_batch_tokens=max(max_batch_size * length, 1), pad_multiple=8, pass_tokens=pass_tokens,
                          bytes_per_token=per_token_output_bytes(self.sessions[0], list(names)))

    def run(self, items: Sequence[ModelItem], keep: Keep, shape: BatchShape | None = None) -> list[Rows]:
        """Every item's kept rows, in order. With several sessions, every lane-th item runs on its own session, all
        lanes at once (each lane's plan sorts its share by length, so padding stays as low as in one)."""
        shape = shape or self.shape(keep.names)
        runners = [onnx_runner(session, list(keep.names)) for session in self.sessions]
        if self._lanes is None:
            return run_items(runners[0], items, self.token_rows, shape, keep)
        count = len(runners)
        running = [self._lanes.submit(run_items, run, items[lane::count], self.token_rows, shape, keep)
                   for lane, run in enumerate(runners)]
        kept: list[Any] = [None] * len(items)
        for lane, future in enumerate(running):
            kept[lane::count] = future.result()
        return kept

    def decode(self, prepared: list[Prepared], kept: Sequence[Any], options: Any,
               finish: Finish | None = None) -> list[Any]:
        """One result per input from every item's kept rows (in `items_of(prepared)` order): the task's decode, or
        `finish` (a route's own)."""
        outputs = per_input(prepared, kept)
        if finish is not None:
            return finish(prepared, outputs)
        return self.definition.decode(self.tokenizer, self.spec, prepared, outputs, options)

    def answer(self, prepared: list[Prepared], options: Any, keep: Keep | None = None,
               shape: BatchShape | None = None, finish: Finish | None = None) -> list[Any]:
        """Run every item of the prepared inputs and decode them."""
        keep = keep or self.keep(options)
        return self.decode(prepared, self.run(items_of(prepared), keep, shape), options, finish)

    def __call__(self, inputs: Sequence[Any], options: Any = None) -> list[Any]:
        """One result per input, as the task's route answers them (options: the task's; None: its defaults)."""
        options = self.definition.options() if options is None else options
        return self.answer(self.prepare(inputs, options), options)

    def close(self) -> None:
        if self._lanes is not None:
            self._lanes.shutdown()
