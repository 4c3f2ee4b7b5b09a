"""Prometheus metrics of the service, in one registry per app (so tests can build many apps).

Names follow the guide: `berth_` prefix, base units, `_total` counters, `_seconds` histograms, and
labels with bounded values only (model names come from the repository, never from the request;
route templates, status codes, fixed reasons). docs/SERVICE.md has the table of names and meanings.

With more than one server process (`berth serve --workers N`), `berth serve` sets PROMETHEUS_MULTIPROC_DIR for
its workers: each writes its values to files there and /metrics, whichever worker answers it, adds up every
worker's counters and histograms (those of workers that have exited included); each gauge says how it combines
across the live workers (`multiprocess_mode`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BATCH_TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)

DROP_REASONS = ("cancelled", "expired", "shutdown")  # an admitted item not computed
REJECT_REASONS = ("queue_full", "not_accepting", "too_large")  # an item refused at admission
CANARY_KINDS = ("probe", "confirm")  # on a timer while the model is not ready | after a pass whose every item failed
CANARY_OUTCOMES = ("passed", "failed")
FAILURE_KINDS = ("timeout", "error", "nonfinite")  # why a pass counted against the model (service/batcher.py)
# connections the server closed itself
CLOSE_REASONS = ("header_timeout", "over_limit", "head_too_large", "write_timeout", "write_queue_full")

CONTENT_TYPE = CONTENT_TYPE_LATEST
MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's, read when it is imported


def multiprocess_dir() -> str | None:
    """The folder where the worker processes of one server write their metric values; None with one
    process."""
    return os.environ.get(MULTIPROCESS_DIR_ENV) or None


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    """One model's children of the metrics its batcher updates per item or pass (bound once: `labels()` on every
    update was ~5% of the event loop's time under load)."""

    queue_depth: Any
    queue_wait: Any
    model_ready: Any
    inference_duration: Any
    batch_size: Any
    batch_tokens: Any
    items_inferred: Any


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "berth_requests", "HTTP requests answered, by route template, model and status code",
            ["route", "model", "status"], registry=r)
        self.request_duration = Histogram(
            "berth_request_duration_seconds", "Time from request received to response ready",
            ["route", "model"], buckets=LATENCY_BUCKETS, registry=r)
        self.request_inputs = Counter(
            "berth_request_inputs", "Inputs (texts, pairs, questions) of requests admitted to the queue",
            ["route", "model"], registry=r)
        self.queue_wait = Histogram(
            "berth_queue_wait_seconds", "Time an item waited in the queue before its forward pass began",
            ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.inference_duration = Histogram(
            "berth_inference_duration_seconds", "Duration of one forward pass (one padded batch)",
            ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram(
            "berth_batch_size", "Items (sequences) in one forward pass",
            ["model"], buckets=BATCH_SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram(
            "berth_batch_tokens", "Padded tokens (batch size x bucket length) in one forward pass",
            ["model"], buckets=BATCH_TOKEN_BUCKETS, registry=r)
        self.items_inferred = Counter(
            "berth_items_inferred", "Items computed by the model (warm-up not counted)", ["model"], registry=r)
        self.inference_failures = Counter(
            "berth_inference_failures", "Forward passes that raised (each retried half counts again)",
            ["model"], registry=r)
        self.items_failed = Counter(
            "berth_items_failed", "Items answered 500 by inference: their pass failed even alone, ran past "
            "pass_timeout_s, or gave them NaN or infinite outputs", ["model"], registry=r)
        self.queue_depth = Gauge(
            "berth_queue_depth", "Items waiting in the queue (not yet in a forward pass)", ["model"],
            registry=r, multiprocess_mode="livesum")
        self.items_dropped = Counter(
            "berth_items_dropped", "Admitted items dropped before their forward pass, by reason",
            ["model", "reason"], registry=r)
        self.items_rejected = Counter(
            "berth_items_rejected", "Items refused at admission, by reason", ["model", "reason"], registry=r)
        self.model_info = Gauge(
            "berth_model_info", "Served models (value 1) with their task, precision and execution provider",
            ["model", "task", "precision", "provider"], registry=r, multiprocess_mode="livemax")
        self.model_ready = Gauge(
            "berth_model_ready", "1 when the model is loaded, warmed up and not failing (see max_consecutive_failures)",
            ["model"], registry=r, multiprocess_mode="livemin")  # 1 only where every live worker has it ready
        self.canary_passes = Counter(
            "berth_canary_passes", "Canary passes (a warm-up shape) by kind (probe: on a timer while the model is not "
            "ready; confirm: after a pass whose every item failed) and outcome", ["model", "kind", "outcome"],
            registry=r)
        self.pass_timeouts = Counter(
            "berth_pass_timeouts", "Forward passes the watchdog terminated for running past pass_timeout_s",
            ["model"], registry=r)
        self.nonfinite_outputs = Counter(
            "berth_nonfinite_outputs", "Items whose outputs held NaN or infinity (answered 500)", ["model"],
            registry=r)
        self.model_failures = Counter(
            "berth_model_failures", "Forward passes counted against the model (toward max_consecutive_failures), "
            "by kind: timeout, error or nonfinite (the last two only when a canary pass failed too)",
            ["model", "kind"], registry=r)

        self.open_connections = Gauge(
            "berth_open_connections", "HTTP connections open now (those refused beyond max_connections not counted)",
            registry=r, multiprocess_mode="livesum")
        self.connections_closed = Counter(
            "berth_connections_closed", "Connections the server closed itself, by reason: header_timeout (no "
            "complete request head within header_timeout_s), over_limit (beyond max_connections, after a 503), "
            "head_too_large (431), write_timeout (a client that did not read its answer within write_timeout_s), "
            "write_queue_full (beyond max_queued_response_bytes unsent to slow readers)", ["reason"], registry=r)
        for reason in CLOSE_REASONS:
            self.connections_closed.labels(reason)

    def register_model(self, model: str, task: str, precision: str, provider: str) -> None:
        self.model_info.labels(model, task, precision, provider).set(1)
        self.queue_depth.labels(model).set(0)
        self.inference_failures.labels(model)
        self.items_failed.labels(model)
        for reason in DROP_REASONS:
            self.items_dropped.labels(model, reason)
        for reason in REJECT_REASONS:
            self.items_rejected.labels(model, reason)
        for kind in CANARY_KINDS:
            for outcome in CANARY_OUTCOMES:
                self.canary_passes.labels(model, kind, outcome)
        self.pass_timeouts.labels(model)
        self.nonfinite_outputs.labels(model)
        for kind in FAILURE_KINDS:
            self.model_failures.labels(model, kind)

    def for_model(self, model: str) -> ModelMetrics:
        return ModelMetrics(*(getattr(self, name).labels(model) for name in ModelMetrics.__slots__))

    def exposition(self) -> bytes:
        """The text /metrics answers: this registry's values, or every worker's together (multiprocess
        mode)."""
        if multiprocess_dir() is None:
            return generate_latest(self.registry)
        from prometheus_client.multiprocess import MultiProcessCollector

        combined = CollectorRegistry()
        MultiProcessCollector(combined)
        return generate_latest(combined)
