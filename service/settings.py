"""The service's settings: one pydantic model, filled from `BERTH_*` environment variables and CLI flags.

Every field has a default that works out of the box on a laptop; `berth serve` prints the effective
values at start (the API key masked). A field `foo_bar` is read from `BERTH_FOO_BAR`; lists are
comma-separated (`BERTH_MODEL_NAMES=sst2,squad`) or JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from tasks.runtime.inference import PASS_OUTPUT_BYTES

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

ENV_PREFIX = "BERTH_"
CORES_PER_WORKER = 4  # workers=0: one server process per this many usable cores (docs/SERVICE.md says why)


class ServiceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # -- what to serve, where
    models: Path = Field(Path("models"), description="model repository: a folder of bundles (one sub-folder each)")
    model_names: list[str] | None = Field(None, description="serve only these bundles (default: all of them)")
    host: str = Field("127.0.0.1", description="interface to listen on")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0: any free one)")

    # -- dynamic batching (per model)
    max_batch_size: int = Field(32, ge=1, description="most items (sequences) in one forward pass")
    max_batch_tokens: int = Field(8192, ge=1, description="most padded tokens (items x bucket length) in one pass")
    max_wait_ms: float = Field(
        2.0, ge=0, description="milliseconds a batch may wait for more items, only while requests that are being "
                               "tokenized for this model are known to be coming (never when the queue is idle)")
    length_buckets: list[int] = Field(
        [16, 32, 64, 128, 256, 384, 512],
        description="on CUDA: sequence lengths a batch is padded to (clipped to each model's max_seq_length); "
                    "warm-up shapes everywhere",
    )
    pad_multiple: int = Field(8, ge=1, description="on the CPU a batch is padded to its longest item, rounded up "
                                                   "to a multiple of this")
    cpu_pass_tokens: int = Field(
        1024, ge=0, description="on the CPU without a batch_table: padded tokens (items x width) of one forward pass; "
                                "more items go to another pass (past ~1,000 tokens a larger CPU batch only adds "
                                "latency, docs/SERVICE.md). 0: max_batch_size and max_batch_tokens alone")
    max_pass_output_bytes: int = Field(
        PASS_OUTPUT_BYTES, ge=1024 * 1024,
        description="bytes of per-token outputs one forward pass may return (fill-mask's logits are 122 KB a token "
                    "on a 30,522-word vocabulary): a pass takes fewer tokens (at least one item), so what a pass "
                    "holds is bounded in bytes as well as in tokens")
    batch_table: Path | None = Field(
        None, description="measured batch sizes (`python -m bench.batch_table`): a JSON file for every model, or a "
                          "folder of <model name>.json; a pass at a given padded length takes the table's best batch "
                          "size (capped by max_batch_size). Without one: cpu_pass_tokens on the CPU, "
                          "max_batch_size on CUDA")
    pipeline: bool = Field(True, description="take and pad the next batch while the current forward pass runs")
    max_queue_items: int = Field(2048, ge=1, description="items waiting per model; beyond, 429 + Retry-After")
    retry_after_s: int = Field(1, ge=1, description="the least Retry-After on 429/503, in seconds")

    # -- request limits
    max_inputs_per_request: int = Field(256, ge=1, description="inputs in one request's list (else 413)")
    max_chars_per_input: int = Field(100_000, ge=1, description="characters of one text/context (else 413)")
    max_chars_per_request: int = Field(
        200_000, ge=1, description="characters of all texts of one request, checked before tokenizing (else 413)")
    max_tokens_per_request: int = Field(
        32_768, ge=1, description="tokens of all model items (windows) of one request, checked after tokenizing "
                                  "and before any inference (else 413)")
    max_items_per_request: int = Field(
        256, ge=1, description="model items (sequences, NER/QA windows) of one request (else 413)")
    max_answer_length_cap: int = Field(
        64, ge=1, description="the largest max_answer_length (tokens) a QA request may ask for (else 422)")
    max_concurrent_requests: int = Field(
        256, ge=1, description="/v1 requests in progress at once (counted once the body has arrived); beyond, "
                               "429 + Retry-After")
    max_body_reads: int = Field(
        64, ge=1, description="/v1 requests whose body is still arriving at once; beyond, 429 + Retry-After")
    body_read_timeout_s: float = Field(
        10.0, gt=0, description="seconds to receive a request body; beyond, 408")
    header_timeout_s: float = Field(
        10.0, gt=0, description="seconds a connection may take to send a request's headers (also between "
                                "requests, with keep_alive_timeout_s the shorter one for an idle connection); "
                                "beyond, the connection is closed")
    keep_alive_timeout_s: float = Field(
        5.0, gt=0, description="seconds an idle keep-alive connection stays open")
    write_timeout_s: float = Field(
        30.0, gt=0, description="seconds a client that stopped reading may hold an answer it has not read (more than "
                                "64 KiB unsent); beyond, the connection is aborted and its unsent bytes freed")
    max_queued_response_bytes: int = Field(
        256 * 1024 * 1024, ge=1024, description="unsent answer bytes held for clients that stopped reading, all "
                                                "connections together; a connection that stalls beyond is aborted")
    max_connections: int = Field(
        1024, ge=1, description="open connections at once; a connection beyond is answered 503 and closed")
    max_response_bytes: int = Field(
        32 * 1024 * 1024, ge=1024, description="estimated JSON bytes of one request's answer, checked after "
                                               "tokenizing and before any inference (else 413)")
    max_inflight_response_bytes: int = Field(
        256 * 1024 * 1024, ge=1024, description="estimated bytes of the answers of all requests in progress; a "
                                                "request beyond gets 429 + Retry-After (413 when it alone is larger)")
    max_masks_per_input: int = Field(
        16, ge=1, description="[MASK] tokens in one fill-mask input (else 413)")
    max_consecutive_failures: int = Field(
        5, ge=1, description="failed forward passes in a row after which a model reports not ready (/readyz 503); "
                             "an input that fails alone on a pass that others of its batch passed does not count")
    canary_interval_s: float = Field(
        5.0, gt=0, description="seconds between canary passes (a warm-up shape) on a model marked not ready; one "
                               "that succeeds makes it ready again")
    pass_timeout_s: float = Field(
        60.0, gt=0, description="a forward pass running longer is terminated (watchdog): its items fail with 500, "
                                "its compute slots are freed, and it counts as a failure of the model")
    ready_models: list[str] | None = Field(
        None, description="models that must be ready for /readyz to answer 200 (default: every model served)")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="request body size in bytes (else 413)")
    request_timeout_s: float = Field(30.0, gt=0, description="seconds to answer a request; beyond, 504")
    tokenize_in_thread_chars: int = Field(
        2000, ge=0, description="requests with more characters than this are tokenized in the tokenizer worker "
                                "thread (GIL released), not on the event loop")

    # -- security and logs
    api_key: SecretStr | None = Field(None, description="when set, /v1 routes need `Authorization: Bearer <key>`; "
                                                      "surrounding whitespace (a file's trailing newline) is "
                                                      "stripped; an empty key is refused at start")
    bundle_public_key: Path | None = Field(
        None, description="an Ed25519 public key (PEM, `berth sign-bundle --new-key`): every bundle must carry a "
                          "signature made with its private key, else the server refuses to start")
    log_json: bool = Field(False, description="one JSON object per log line (the start-up settings included)")
    log_level: str = Field("info", description="debug | info | warning | error | critical")
    access_log: bool = Field(False, description="one log line per request (logger berth.access): method, route, "
                                                "model, status, inputs, items, tokens, stage seconds, request "
                                                "id; never the request's text")
    playground: bool = Field(True, description="serve the playground page at / (false: 404, for locked-down "
                                               "deployments)")

    # -- text-embeddings-inference's routes (/embed, /predict, /rerank...) serve one model each
    tei_embed_model: str | None = Field(
        None, description="the embedding model of /embed and /embed_all (default: the one embedding model served, "
                          "when there is exactly one)")
    tei_predict_model: str | None = Field(
        None, description="the classification or pair model of /predict (default: the one such model served, when "
                          "there is exactly one)")
    tei_rerank_model: str | None = Field(
        None, description="the rerank model of /rerank (default: the one rerank model served, when there is "
                          "exactly one)")

    # -- server processes
    workers: int = Field(
        0, ge=0, description="server processes sharing the port, each with its own models, batchers and "
                             "event loop and cores // N of the usable cores for ONNX Runtime (memory grows "
                             "N-fold). 0: one per "
                             f"{CORES_PER_WORKER} usable cores, so one below {2 * CORES_PER_WORKER} cores")

    # -- ONNX Runtime
    intra_op_threads: int = Field(
        0, ge=0, description="threads of a lone forward pass (0: the usable cores, cgroup CPU quota respected); "
                             "the passes of all models together never run more threads than the usable cores")
    parallel_passes: int = Field(
        0, ge=0, description="CPU: forward passes one model runs at once when more work is waiting, each on "
                             "cores // N threads (0: one per usable core; 1: one pass at a time, on all threads)")
    tokenizer_threads: int = Field(1, ge=1, description="threads that tokenize and decode large requests off "
                                                        "the event loop")
    ort_spinning: bool = Field(
        False, description="let idle ONNX Runtime threads busy-wait, also between passes (faster only on cores "
                           "nothing else needs)"
    )
    ort_spin_in_pass: bool = Field(
        True, description="let ONNX Runtime threads busy-wait between the operators of one pass, and sleep once "
                          "it ends (a lone pass runs faster; under load passes run single-threaded, where "
                          "nothing spins)")
    ort_shared_memory: bool = Field(
        True, description="CPU: the sessions of one model share one copy of its weights, and every session "
                          "one memory arena growing by what is asked (false: ONNX Runtime's default, a copy "
                          "and "
                          "an arena per session; docs/SERVICE.md measures both)")
    ort_prepack_weights: bool = Field(
        True, description="with ort_shared_memory: let ONNX Runtime prepack the GEMM weights of each "
                          "session, a packed copy per session (false: ~30 MB less a small int8 model, whose "
                          "logits then differ in rounding by up to ~0.02 from a default session's; "
                          "docs/SERVICE.md)")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: CUDA when present and fit for the bundle's precision (never for int8), else CPU"
    )
    warmup: bool = Field(True, description="run every length bucket once before reporting ready")

    # -- shutdown
    drain_delay_s: float = Field(
        0.0, ge=0, description="on SIGTERM: seconds to keep serving with /readyz 503, so load balancers notice")
    shutdown_timeout_s: float = Field(
        20.0, ge=0, description="after the drain delay: seconds in-flight work may take; 0: do not wait")

    @field_validator("length_buckets")
    @classmethod
    def _sorted_buckets(cls, value: list[int]) -> list[int]:
        if not value or min(value) < 1:
            raise ValueError("length_buckets needs at least one positive length")
        return sorted(set(value))

    @field_validator("model_names", "ready_models", "tei_embed_model", "tei_predict_model", "tei_rerank_model",
                     mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value in ("", [], ()) else value

    @field_validator("log_level")
    @classmethod
    def _known_log_level(cls, value: str) -> str:
        level = value.strip().lower()
        if level not in LOG_LEVELS:
            raise ValueError(f"{value!r} is not a log level; use one of: {', '.join(LOG_LEVELS)}")
        return level

    @field_validator("api_key")
    @classmethod
    def _no_empty_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        key = value.get_secret_value().strip()  # `kubectl create secret --from-file` keeps an editor's newline
        if not key:
            raise ValueError("BERTH_API_KEY is set but empty: an empty key would let `Authorization: Bearer ` in. "
                             "Unset BERTH_API_KEY to serve without authentication, or set a non-empty key")
        if any(ch.isspace() or not ch.isprintable() for ch in key):
            raise ValueError("BERTH_API_KEY contains whitespace or control characters inside it; an HTTP header "
                             "cannot carry them, so no client could send it")
        if not key.isascii():
            raise ValueError("BERTH_API_KEY contains non-ASCII characters: HTTP clients disagree on how to send them "
                             "in a header (Latin-1 or UTF-8), so some clients could never match it; use printable "
                             "ASCII (e.g. `openssl rand -hex 32`)")
        return SecretStr(key)

    @model_validator(mode="after")
    def _budget_fits_a_sequence(self) -> ServiceSettings:
        if self.max_batch_tokens < self.length_buckets[0]:
            raise ValueError(f"max_batch_tokens={self.max_batch_tokens} is below the smallest length bucket")
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ServiceSettings:
        """Defaults, then `BERTH_*` variables, then `overrides` (CLI flags; None means "not given")."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, field in cls.model_fields.items():
            raw = environ.get(ENV_PREFIX + name.upper())
            if raw is not None:
                values[name] = _parse_env(raw, field.annotation)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def worker_count(self, cores: int) -> int:
        """Server processes on a machine of `cores` usable cores: `workers`, or one per CORES_PER_WORKER."""
        return self.workers or max(1, cores // CORES_PER_WORKER)

    def describe(self) -> dict[str, Any]:
        """The effective settings as plain JSON values, the API key masked."""
        out = self.model_dump(mode="json")
        out["api_key"] = "***" if self.api_key else None
        return out


def _parse_env(raw: str, annotation: Any) -> Any:
    """Lists from JSON or comma-separated text; everything else is left to pydantic's coercion."""
    if "list" in str(annotation):
        raw = raw.strip()
        if raw.startswith("["):
            return json.loads(raw)
        return [part.strip() for part in raw.split(",") if part.strip()]
    return raw
