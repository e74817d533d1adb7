"""Structured logs of the proxy: one JSON object per line (python-json-logger), keys never logged.

:func:`configure` installs a handler on the ``historygraph`` logger. Every request logs one
``historygraph.server`` record ``"request"`` with ``session``, ``api``, ``policy``, ``budget``,
``status``, ``history_tokens_in``/``_out`` and ``render_ms`` as fields; an upstream that gave no
answer adds a WARNING ``"upstream unreachable"`` record with the reason
(:func:`~historygraph.server.upstream.unreachable_error`). Request headers are never
logged; :class:`RedactKeys` also masks anything shaped like a credential (``sk-…``,
``Bearer …``, ``x-api-key: …``, the credentials of a URL ``https://user:password@host``) in every
message and field, in case an upstream error text quotes one.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any, TextIO

from pythonjsonlogger.json import JsonFormatter

_SECRET = re.compile(r"(?i)(sk-[a-z0-9_\-]{6,}|bearer\s+[a-z0-9._\-]{6,}|(x-api-key|api[_-]key)[\"']?\s*[:=]\s*[\"']?[^\s\"',}]+)")
_USERINFO = re.compile(r"(?<=://)[^/\s@]+@")  # user:password@ of a URL
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def redact(text: str) -> str:
    """``text`` with every credential-shaped substring replaced by ``[redacted]``."""
    return _USERINFO.sub("[redacted]@", _SECRET.sub("[redacted]", text))


class RedactKeys(logging.Filter):
    """Masks credential-shaped text in a record's message, arguments and extra fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(str(record.msg))
        if record.args:
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in
                                (record.args if isinstance(record.args, tuple) else (record.args,)))
        for k, v in list(vars(record).items()):
            if k not in _STANDARD and isinstance(v, str):
                setattr(record, k, redact(v))
        return True


class TextFields(logging.Formatter):
    """Plain text: time, level, logger, message, then the record's fields as ``key=value`` (those
    the JSON lines carry), so ``--log-format text`` says as much as the default."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_"))
        return f"{line} {fields}" if fields else line


def configure(level: str = "INFO", stream: TextIO | None = None, json: bool = True) -> logging.Handler:
    """Log the ``historygraph`` logger's records to ``stream`` (default stderr), as JSON lines
    (``json=False``: plain text); returns the handler installed (replacing an earlier one)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    fmt: Any = (JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s", rename_fields={"levelname": "level"})
                if json else TextFields("%(asctime)s %(levelname)s %(name)s %(message)s"))
    handler.setFormatter(fmt)
    handler.addFilter(RedactKeys())
    handler.set_name("historygraph")
    root = logging.getLogger("historygraph")
    for h in list(root.handlers):
        if h.get_name() == "historygraph":
            root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
