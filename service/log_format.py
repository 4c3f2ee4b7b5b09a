"""The service's log lines: one line per event, JSON objects under `--log-json`, every line of a request carrying
its id (service/request_ids.py).

A record may carry structured fields in `extra={"fields": {...}}` (the access log's, the start-up settings):
under JSON they are keys of the line's object; as text they follow the message as `key=value` pairs.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from service.request_ids import RequestIdFilter


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {"time": self.formatTime(record), "level": record.levelname,
                                 "logger": record.name, "message": record.getMessage()}
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            entry["request_id"] = request_id
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        head, newline, rest = super().format(record).partition("\n")  # a traceback stays below the line
        fields = getattr(record, "fields", None)
        if fields:
            head += "".join(f" {key}={value if isinstance(value, str) else json.dumps(value, default=str)}"
                            for key, value in fields.items())
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            head += f" request_id={request_id}"
        return head + newline + rest


def configure_logging(level: str, as_json: bool) -> None:
    """Root logging for berth and uvicorn: one handler on stderr, every record with its request's id."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else TextFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


def startup_line(message: str, fields: dict[str, Any], as_json: bool) -> str:
    """A start-up line (the effective settings) printed whatever the log level: a JSON object under --log-json."""
    if as_json:
        record = logging.LogRecord("berth.service", logging.INFO, __file__, 0, message, None, None)
        record.fields = {"settings": fields}
        return JsonFormatter().format(record)
    return message + ": " + json.dumps(fields, sort_keys=True)


def error_line(command: str, message: str, as_json: bool) -> str:
    """A command's fatal error: `berth serve: ...`, or one JSON object under --log-json."""
    if not as_json:
        return f"{command}: {message}"
    record = logging.LogRecord("berth.service", logging.ERROR, __file__, 0, f"{command}: {message}", None, None)
    return JsonFormatter().format(record)
