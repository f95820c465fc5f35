"""Structured logs: every record may carry `extra={"fields": {...}}` naming its pod, GPU, resource."""

from __future__ import annotations

import json
import logging
import sys
import time


class _Text(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None) or {}
        stamp = self.formatTime(record, "%Y-%m-%dT%H:%M:%S")
        base = f"{stamp} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if fields:
            base += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        if record.exc_info:
            base += "\n" + self.formatException(record.exc_info)
        return base


class _Json(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup(level: str = "INFO", fmt: str = "text") -> None:
    """Configure the root logger once, to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Json() if fmt == "json" else _Text())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
