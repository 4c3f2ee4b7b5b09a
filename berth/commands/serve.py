"""`berth serve`: serve a model repository (a folder of bundles) over HTTP.

A shim: the flags become a ServiceSettings (defaults, then --config, then `BERTH_*` variables, then the flags
given), passed whole to service/server.py, which holds the lifecycle (start, serve, drain on SIGTERM, --workers).
The API key is read from BERTH_API_KEY only, so it never shows in a process listing; an empty one is refused.
"""

from __future__ import annotations

import argparse
import sys

from berth.config_files import ConfigError, add_config_flag, merged_settings
from berth.flags import add_settings_flags, given_settings
from service.settings import ENV_PREFIX, ServiceSettings

FLAG_NAMES = {  # the flags' short names; every other setting is --its-name
    "model_names": "--model", "max_inputs_per_request": "--max-inputs", "max_chars_per_input": "--max-chars",
    "request_timeout_s": "--request-timeout", "intra_op_threads": "--threads", "drain_delay_s": "--drain-delay",
    "shutdown_timeout_s": "--shutdown-timeout", "ready_models": "--ready-model",
}
GROUPS = {
    "what to serve, where": ["models", "model_names", "host", "port", "device", "warmup", "playground"],
    "dynamic batching (per model)": ["max_batch_size", "max_batch_tokens", "max_wait_ms", "cpu_pass_tokens",
                                     "max_pass_output_bytes", "batch_table", "pipeline", "length_buckets",
                                     "pad_multiple", "max_queue_items", "retry_after_s"],
    "request limits": ["max_inputs_per_request", "max_chars_per_input", "max_chars_per_request",
                       "max_tokens_per_request", "max_items_per_request", "max_answer_length_cap",
                       "max_concurrent_requests", "max_body_reads", "body_read_timeout_s", "max_body_bytes",
                       "request_timeout_s", "tokenize_in_thread_chars", "max_response_bytes",
                       "max_inflight_response_bytes", "max_masks_per_input"],
    "connections": ["header_timeout_s", "keep_alive_timeout_s", "max_connections"],
    "health and trust": ["max_consecutive_failures", "canary_interval_s", "pass_timeout_s", "ready_models",
                         "bundle_public_key"],
    "server processes": ["workers"],
    "ONNX Runtime and threads": ["intra_op_threads", "parallel_passes", "tokenizer_threads", "ort_spinning",
                                 "ort_spin_in_pass", "ort_shared_memory", "ort_prepack_weights"],
    "logs and shutdown": ["log_level", "log_json", "access_log", "drain_delay_s", "shutdown_timeout_s"],
}
OPTIONS = {  # --model NAME, repeated (as before), not a comma-separated list
    "model_names": {"action": "append", "metavar": "NAME", "help": "serve only this bundle (repeat for several)"},
    "ready_models": {"action": "append", "metavar": "NAME",
                     "help": "this model must be ready for /readyz to answer 200 (repeat for several; default: all)"},
}
NOT_FLAGS = ["api_key"]  # read from BERTH_API_KEY only, so it never shows in a process listing


def settings_from_args(args: argparse.Namespace) -> ServiceSettings:
    """Defaults, then the --config file, then BERTH_* variables, then the flags given."""
    return merged_settings(ServiceSettings, getattr(args, "config", None), given_settings(args, ServiceSettings),
                           env_prefix=ENV_PREFIX)


def run(args: argparse.Namespace) -> int:
    from service.server import main

    try:
        settings = settings_from_args(args)
    except ConfigError as error:
        print(f"berth serve: {' '.join(str(error).split())}", file=sys.stderr)  # one line, whatever it quotes
        return 2
    return main(settings)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve", help="serve a folder of bundles over HTTP (FastAPI + ONNX Runtime, dynamic batching)",
        description="Serve every bundle in --models (or those named with --model) on http://HOST:PORT: "
                    "POST /v1/classify, /v1/pair, /v1/ner, /v1/qa; GET /v1/models, /healthz, /readyz, /metrics, "
                    "/docs. Each flag has a BERTH_* environment variable (e.g. BERTH_MAX_BATCH_SIZE); set "
                    "BERTH_API_KEY to require `Authorization: Bearer <key>` on /v1.")
    add_settings_flags(p, ServiceSettings, groups=GROUPS, names=FLAG_NAMES, options=OPTIONS, exclude=NOT_FLAGS,
                       env_prefix=ENV_PREFIX)
    add_config_flag(p)  # precedence: defaults < --config < BERTH_* < flags
    p.set_defaults(func=run)
    return p
