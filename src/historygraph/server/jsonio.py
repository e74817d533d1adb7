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

A proxied request re-sends the whole conversation, and most of it is forwarded as the client
sent it; :func:`loads_request` therefore leaves each item of the ``messages`` array unparsed, as
a ``msgspec.Raw`` (the client's bytes of that item, copied verbatim by :func:`dumps`), parsed by
:func:`item` only when the proxy needs its value (``historygraph.server.sessions``: only the
messages that are new or differ from those last stored are).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])
_items = msgspec.json.Decoder(list[msgspec.Raw])
Raw = msgspec.Raw


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


def loads_request(data: bytes, key: str = "messages") -> tuple[Any, bool]:
    """:func:`loads`, except that when the document is an object whose ``key`` is an array, that
    array's items stay unparsed (``msgspec.Raw``; see module docstring; :func:`item` parses one).
    Every other value, and every document msgspec refuses or that is not such an object, is as
    :func:`loads` gives it. The document must be UTF-8 (``UnicodeDecodeError`` otherwise, as
    :func:`loads` raises); msgspec does not check the bytes of the strings it leaves unparsed,
    so they are checked here first."""
    if not data.isascii():
        data.decode("utf-8")
    try:
        top = _fields.decode(data)
        out: dict[str, Any] = {k: _items.decode(v) if k == key else _decoder.decode(v) for k, v in top.items()}
        if key not in out:
            raise KeyError(key)
    except (msgspec.DecodeError, KeyError):  # not an object, no such array, or refused: as loads does
        return loads(data)
    return out, True


def item(value: Any) -> Any:
    """The value of one item :func:`loads_request` left unparsed (anything else is returned as is),
    with :func:`loads`'s semantics (``ValueError`` when it is not JSON)."""
    return loads(bytes(value))[0] if isinstance(value, msgspec.Raw) else value


def plain(values: list[Any]) -> list[Any]:
    """``values`` with every unparsed item parsed (for code that reads or edits the messages)."""
    return [item(v) for v in values]
