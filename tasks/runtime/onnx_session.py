"""One place that decides where an ONNX model runs: CUDA when present and fit, else the CPU, and the
task layer's runners over a session (tasks/runtime/inference.py).

Used by export (the parity gate), evaluation, `berth predict`, the engine benchmark and the service, so all
run a bundle the same way. Imports onnxruntime lazily; torch-free.
"""

from __future__ import annotations

import hashlib
import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.runtime.inference import ItemRunner, Runner, item_runner
from tasks.runtime.protobuf_wire import WireError

logger = logging.getLogger(__name__)
_said: set[str] = set()  # fallback notes already logged: one line per process, not one per session


def _note_once(level: int, message: str, *args: object) -> None:
    text = message % args
    if text not in _said:
        _said.add(text)
        logger.log(level, text)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def choose_provider(precision: str, prefer_gpu: bool = True, available: list[str] | None = None) -> str:
    """The execution provider for a model of `precision`, given the providers this onnxruntime has.

    int8 (dynamic quantization) has no CUDA kernels, so it always runs on the CPU. fp32 and fp16
    run on CUDA when it is available and wanted; otherwise on the CPU, with one log line saying
    why (an fp16 graph on the CPU runs, but slower than fp32).
    """
    if available is None:
        import onnxruntime

        available = onnxruntime.get_available_providers()
    if precision == "int8":
        if prefer_gpu and CUDA in available:
            _note_once(logging.INFO, "int8 model: running on %s (int8 dynamic quantization has no CUDA kernels)", CPU)
        return CPU
    if prefer_gpu and CUDA in available:
        return CUDA
    if prefer_gpu:
        note = (" (fp16 on CPU is slower than fp32; prefer an fp32 or int8 bundle on CPU-only hosts)"
                if precision == "fp16" else "")
        level = logging.WARNING if precision == "fp16" else logging.INFO
        _note_once(level, "%s not available; running %s models on %s%s", CUDA, precision, CPU, note)
    return CPU


@dataclass(frozen=True)
class MemoryPolicy:
    """How the CPU sessions a process creates from a model's bytes use memory. The default is ONNX
    Runtime's own: each session parses its own copy of the weights and grows its own arena. The service sets
    `serving()`.

    share_weights: the sessions of one model (the same bytes) share one copy of its large initializers
        (`large_initializers` made OrtValues once, given to each session with
        `SessionOptions.add_initializer`: ORT uses the caller's buffers). Measured better than
        `add_external_initializers` on stripped bytes, which ORT copies into each session.
    prepacking: let ORT prepack constant GEMM weights per session (a packed copy per session; answers bit for
        bit those of a default session). Off: ~30 MB less a small int8 model, int8 logits differ by up to
        ~0.02.
    shared_arena: every session of the process allocates from one CPU arena registered in ORT's environment
        (`create_and_register_allocator`, `session.use_env_allocators`), growing by what is asked
        (kSameAsRequested), not in power-of-two steps: the peak of the passes running at once, not one per
        session.
    """

    share_weights: bool = False
    prepacking: bool = True
    shared_arena: bool = False

    @classmethod
    def serving(cls, prepacking: bool = True) -> MemoryPolicy:
        return cls(share_weights=True, prepacking=prepacking, shared_arena=True)


_policy = MemoryPolicy()
_arena_registered = False
_shared: weakref.WeakValueDictionary[str, SharedWeights] = weakref.WeakValueDictionary()


def set_memory_policy(policy: MemoryPolicy) -> None:
    """The policy of the CPU sessions this process creates from bytes from now on (the service's, at
    its start)."""
    global _policy
    _policy = policy


class SharedWeights:
    """One model's large initializers as OrtValues, for every session of that model in this process (each
    session holds a reference: the values live as long as a session of the model does)."""

    def __init__(self, model_bytes: bytes):
        import onnxruntime

        from tasks.runtime.onnx_weights import large_initializers

        weights = large_initializers(model_bytes)
        self.values = [(name, onnxruntime.OrtValue.ortvalue_from_numpy(array))
                       for name, array in weights.items()]
        self.nbytes = sum(array.nbytes for array in weights.values())


def shared_weights(model_bytes: bytes) -> SharedWeights:
    """The process's SharedWeights of these bytes (by sha256), made on first use."""
    digest = hashlib.sha256(model_bytes).hexdigest()
    weights = _shared.get(digest)
    if weights is None:
        weights = SharedWeights(model_bytes)
        _shared[digest] = weights
    return weights


def _register_shared_arena() -> None:
    """One CPU arena in ORT's environment for every session that asks for the environment's allocators."""
    global _arena_registered
    if _arena_registered:
        return
    import onnxruntime

    memory = onnxruntime.OrtMemoryInfo("Cpu", onnxruntime.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                       onnxruntime.OrtMemType.DEFAULT)
    onnxruntime.create_and_register_allocator(memory, onnxruntime.OrtArenaCfg({"arena_extend_strategy": 1}))
    _arena_registered = True


def trim_heap() -> None:
    """Return the C heap's free pages to the system (glibc's malloc_trim): creating a session parses the whole
    model into temporary buffers, whose pages glibc otherwise keeps after they are freed. No-op elsewhere."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def memory_policy() -> MemoryPolicy:
    return _policy


def session_options(intra_op_threads: int = 0, graph_optimization: str = "all", allow_spinning: bool = True,
                    spin_between_runs: bool = True) -> Any:
    """ORT session options: `intra_op_threads` (0 = ORT's default, one per core), one inter-op thread.

    `allow_spinning=False` makes idle intra-op threads sleep instead of busy-waiting for the next op:
    slower on a dedicated machine, much faster when the cores are shared (a server's own event loop, or
    neighbours), where spinning threads burn the CPU the others need. `spin_between_runs=False` keeps the
    busy-wait inside a run (between its operators, where waking a sleeping thread costs most) and stops
    it when the run ends (ORT's `session.force_spinning_stop`)."""
    import onnxruntime

    levels = {
        "disable": onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = levels[graph_optimization]
    if not allow_spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif not spin_between_runs:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


def create_session(
    model_path: str | Path | bytes,
    precision: str = "fp32",
    intra_op_threads: int = 0,
    prefer_gpu: bool = True,
    graph_optimization: str = "all",
    allow_spinning: bool = True,
    spin_between_runs: bool = True,
) -> tuple[Any, str]:
    """An `onnxruntime.InferenceSession` for `model_path` (or the model's bytes) and the name of the provider
    it runs on."""
    import onnxruntime

    provider = choose_provider(precision, prefer_gpu)
    # fp32 on CUDA: no TF32 matmuls (10-bit mantissa on Ampere+), so an fp32 bundle answers as it
    # did at its parity gate (max |Δ logit| <= 1e-4). Not exercised on this CPU-only machine.
    cuda_options = {"use_tf32": "0"} if precision == "fp32" else {}
    providers = [provider] if provider == CPU else [(provider, cuda_options), CPU]
    options = session_options(intra_op_threads, graph_optimization, allow_spinning, spin_between_runs)
    model: str | bytes = model_path if isinstance(model_path, bytes) else str(model_path)
    weights = None
    if provider == CPU and isinstance(model, bytes):
        if _policy.share_weights:
            try:
                weights = shared_weights(model)
            except WireError as error:  # a graph this reader does not follow: ORT's own copy per session
                logger.warning("weights not shared between this model's sessions: %s", error)
            else:
                for name, value in weights.values:
                    options.add_initializer(name, value)
        if not _policy.prepacking:
            options.add_session_config_entry("session.disable_prepacking", "1")
        if _policy.shared_arena:
            _register_shared_arena()
            options.add_session_config_entry("session.use_env_allocators", "1")
    session = onnxruntime.InferenceSession(model, sess_options=options, providers=providers)
    session.berth_shared_weights = weights  # ORT reads their buffers: they live as long as the session
    if provider == CPU and isinstance(model, bytes):
        release_model_bytes(session)
    return session, session.get_providers()[0]


def release_model_bytes(session: Any) -> None:
    """Let go of the model's bytes that onnxruntime's Python session keeps (`_model_bytes`, "holding the memory
    indefinitely", says its source) only to rebuild itself on another provider after a provider error. A CPU
    session has nothing to fall back to: without this a served model keeps its whole serialized file (62 MiB
    for an int8 MiniLM) alive beside the session's own weights."""
    if getattr(session, "_model_bytes", None) is not None:
        session.disable_fallback()
        session._model_bytes = None


def per_token_output_bytes(session: Any, names: Any = None) -> int:
    """Bytes a padded token adds to a session's per-token outputs ((batch, sequence, ...) with static inner
    dimensions, e.g. fill-mask's (B, T, 30,522) logits: 122,088), as float32; only `names` when given; 0 when
    there are none."""
    import math

    total = 0
    for output in session.get_outputs():
        inner = output.shape[2:]
        if (names is None or output.name in names) and len(output.shape) >= 3 \
                and all(isinstance(d, int) for d in inner):
            total += 4 * math.prod(inner)
    return total


def onnx_runner(session: Any, output_names: Sequence[str]) -> Runner:
    """One padded pass on `session`: the feeds its inputs name, `output_names` fetched."""
    inputs = [node.name for node in session.get_inputs()]
    names = list(output_names)

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, {name: feeds[name] for name in inputs})))

    return run


def onnx_item_runner(session: Any, batch_size: int = 64, progress: str | None = None) -> ItemRunner:
    """`session` as the task definitions' runner (evaluation, the parity metric gate); `progress`: report each
    run under this label."""
    return item_runner(lambda names: onnx_runner(session, names), batch_size, progress)
