"""JSON of the proxy's request path with msgspec (a C parser and encoder), falling back to the
standard library for what msgspec refuses, so that every request means what it meant with ``json``.

Parsing a 200-message request body and encoding the forwarded one were the largest costs of a
proxied request once routing was incremental (``bench/proxy_profile.py``). :func:`loads` gives
the same Python values as :func:`json.loads` for every document msgspec accepts (integers of any
size stay integers; the last of duplicate keys wins); what it refuses (``NaN``/``Infinity``
literals, numbers beyond the float range, lone surrogates) is parsed by ``json`` instead, and
:func:`loads` says so. :func:`dumps` writes what httpx's ``json=`` wrote (``json.dumps(value,
ensure_ascii=False, separators=(",", ":"), allow_nan=False)`` in UTF-8): the same JSON values
with strings escaped alike; float literals are msgspec's shortest round-trip spelling (``1e-05``
may read ``0.00001``, the same number). With ``fast=False`` (a body that needed the standard
parser, which may hold ``NaN``: msgspec would write ``null``) and for any value msgspec cannot
encode, the standard encoder runs, with its errors.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def loads(data: bytes | str) -> tuple[Any, bool]:
    """``(value, fast)``: :func:`json.loads` semantics (raises ``json.JSONDecodeError`` or
    ``UnicodeDecodeError`` as it does); ``fast`` is false when msgspec refused the document."""
    try:
        return _decoder.decode(data), True
    except msgspec.DecodeError:
        return json.loads(data), False


def dumps(value: Any, fast: bool = True) -> bytes:
    """Compact UTF-8 JSON of ``value`` (see module docstring). Raises ``ValueError`` for a
    non-finite float and ``TypeError`` for a value JSON cannot hold, as ``json.dumps`` does."""
    if fast:
        try:
            return _encoder.encode(value)
        except (TypeError, msgspec.EncodeError, OverflowError):
            pass
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
