"""Which number format a training step computes in: fp32, or mixed precision under autocast.

Mixed precision here is autocast only: the weights, their gradients and the optimizer's moments stay
float32 (the master copy); matrix products run in the lower precision. What `auto` picks is detected,
not assumed:

- CUDA: bf16 where the GPU supports it, else fp16 with a GradScaler (fp16's range needs loss scaling).
- CPU: fp32 where the CPU has no native bf16 instructions (AVX-512 BF16 or AMX tiles). Where it has them,
  the trainer times a forward and backward pass of the run's own batches in both (`probe_cpu_precision`) and
  keeps the faster, since bf16 autocast pays on long sequences and costs on short ones. A CPU without them
  emulates bf16 (convert, compute in fp32, round), which costs time instead of saving it; `bf16` can still be
  forced there (e.g. to test the path), with a warning.

`BERTH_CPU_BF16=1` (or `0`) overrides the CPU detection: the machine is treated as one with (or
without) native bf16, so `auto` resolves as it would there. It exists so that the test suite can run
as a bf16 CPU would on any CPU (`make test-bf16`), and the reverse.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any, Literal

import torch

log = logging.getLogger(__name__)

Precision = Literal["auto", "fp32", "bf16", "fp16"]
NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
CPU_BF16_OVERRIDE = "BERTH_CPU_BF16"


def cpu_bf16_support() -> dict[str, bool]:
    """The CPU's native bf16 features as this torch build detects them (False where it cannot tell)."""
    cpu = torch.cpu
    probes = {"avx512_bf16": "_is_avx512_bf16_supported", "amx_tile": "_is_amx_tile_supported"}
    found: dict[str, bool] = {}
    for name, probe in probes.items():
        check = getattr(cpu, probe, None)
        try:
            found[name] = bool(check()) if check is not None else False
        except RuntimeError:
            found[name] = False
    return found


def cpu_bf16_override() -> bool | None:
    """What $BERTH_CPU_BF16 says the CPU has (True / False), or None when it is unset."""
    value = os.environ.get(CPU_BF16_OVERRIDE, "").strip().lower()
    if value in ("", "detect"):
        return None
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{CPU_BF16_OVERRIDE}={value!r}: use 1 (treat the CPU as having native bf16), 0 or detect")


def cpu_has_native_bf16() -> bool:
    """True when bf16 matrix products run in hardware on this CPU (AVX-512 BF16 or AMX), or $BERTH_CPU_BF16 says
    to act as if."""
    forced = cpu_bf16_override()
    return forced if forced is not None else any(cpu_bf16_support().values())


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `precision` on `device`, or None for fp32."""
    if precision == "fp32":
        return None
    if device.type == "cuda":
        if precision == "auto":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if precision == "bf16" else torch.float16
    if device.type != "cpu":
        if precision != "auto":
            log.warning("precision=%s: no mixed precision on %s; training in fp32", precision, device)
        return None
    native = cpu_has_native_bf16()
    if precision == "auto":
        return torch.bfloat16 if native else None
    if precision == "fp16":
        log.warning("precision=fp16 needs CUDA (the CPU path is bf16); training in fp32 on %s", device)
        return None
    if not any(cpu_bf16_support().values()):
        log.warning("precision=bf16 on a CPU without native bf16 (no AVX-512 BF16, no AMX): emulated, so "
                    "slower than fp32, not faster")
    return torch.bfloat16


def precision_name(dtype: torch.dtype | None) -> str:
    """"fp32", "bf16" or "fp16": what a run record says it trained in."""
    return "fp32" if dtype is None else NAMES[dtype]


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Autocast to `dtype` on `device`'s kind, or nothing for fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


PROBE_REPEATS = 2


def probe_cpu_precision(step: Callable[[torch.dtype | None], None],
                        repeats: int = PROBE_REPEATS) -> tuple[torch.dtype | None, dict[str, Any]]:
    """Time `step(dtype)` (a forward and backward pass of the run's own batches) in fp32 and in bf16 and keep
    the faster: whether bf16 autocast pays on a CPU depends on the shapes, not only on the CPU's flags (its casts
    cost more than the bf16 matrix units save on short batches). One untimed pass each warms up; the timed
    passes alternate so that a change in the machine's load falls on both; the best of each is compared."""
    candidates: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}
    for dtype in candidates.values():
        step(dtype)
    best = {name: math.inf for name in candidates}
    for _ in range(repeats):
        for name, dtype in candidates.items():
            started = time.perf_counter()
            step(dtype)
            best[name] = min(best[name], time.perf_counter() - started)
    chosen = min(best, key=best.get)
    record = {"measured_ms": {name: round(seconds * 1000, 2) for name, seconds in best.items()}, "chosen": chosen,
              "repeats": repeats}
    log.info("precision auto: fp32 %.1f ms, bf16 %.1f ms a probe step on this run's batches: %s",
             record["measured_ms"]["fp32"], record["measured_ms"]["bf16"], chosen)
    return candidates[chosen], record


def dtype_named(name: str) -> torch.dtype | None:
    """The autocast dtype a run record's precision name stands for."""
    return {v: k for k, v in NAMES.items()}.get(name)
