"""The one log format of every gpushare process: JSON, one object per line, on stderr.

``{"time", "level", "component", "logger", "msg", ...the call's extra={...} fields, "exc"}``:
``time`` in UTC with milliseconds, ``level`` as Python names it (``INFO``, ``WARNING``), and
``component`` the program (``gpushare-controller``, ``gpushare-node-agent``), so one query
reads the logs of all of them (docs/observability.md, "Logs"). Extra fields that are not plain
JSON values are written as strings.
"""

import json
import logging
import sys
from datetime import UTC, datetime

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_DROPPED = {"settings", "k8s_skip"}
"""Extras Kopf attaches to every record (its whole OperatorSettings: 2 KB a line), not news."""
QUIET = ("httpx", "httpx2", "httpcore", "aiohttp.access")
"""Libraries that log one line per request: kept to warnings."""


class JsonFormatter(logging.Formatter):
    """One record as one JSON object (see the module docstring)."""

    def __init__(self, *, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "component": self.component,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in _DROPPED and not key.startswith("_"):
                entry[key] = value if isinstance(value, (str, int, float, bool)) else str(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, separators=(",", ":"))


def setup_json_logging(*, component: str, level: str = "INFO") -> None:
    """Route every logger (ours and the libraries') to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(component=component))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in QUIET:
        logging.getLogger(noisy).setLevel(logging.WARNING)
