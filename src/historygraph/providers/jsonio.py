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

With ``check=True`` (the proxy's reading of a client's request), what the standard parser
accepts but no provider reads, and the store cannot keep, is refused with :class:`UnusableJSON`
(a ``ValueError`` naming the place, as ``messages[2].content``):
``NaN``/``Infinity`` and numbers beyond the float range (``1e400``), strings holding a lone
UTF-16 surrogate (``"\\ud800"``), and nesting deeper than the parsers go (about 1,000 levels; a
4 KB body can hold it). Checked only on the standard parser's path, which msgspec's refusal
selects, so a body msgspec reads costs nothing more.

A proxied request re-sends the whole conversation, and most of it is forwarded as the client
sent it; :func:`loads_request` therefore leaves each item of the ``messages`` array unparsed, as
a ``msgspec.Raw`` (the client's bytes of that item, copied verbatim by :func:`dumps`), parsed by
:func:`item` only when the proxy needs its value (:mod:`historygraph.providers.openai_chat` and
``historygraph.history.sessions``: only the messages that are new or differ from those last
stored are).
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from typing import Any

import msgspec

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])
_items = msgspec.json.Decoder(list[msgspec.Raw])
Raw = msgspec.Raw


class UnusableJSON(ValueError):
    """JSON that parses but holds a value no provider reads (see the module docstring); ``where``
    is its place in the document (``""``: the document itself)."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}" if where else what)
        self.where, self.what = where, what


def loads(data: bytes | str, check: bool = False) -> tuple[Any, bool]:
    """``(value, fast)``: :func:`json.loads` semantics (raises ``json.JSONDecodeError`` or
    ``UnicodeDecodeError`` as it does); ``fast`` is false when msgspec refused the document.
    ``check``: raise :class:`UnusableJSON` for what no provider reads (module docstring)."""
    try:
        return _decoder.decode(data), True
    except msgspec.DecodeError:
        pass
    except RecursionError:
        if not check:
            raise
        raise UnusableJSON("", TOO_DEEP) from None
    if not check:
        return json.loads(data), False
    try:
        value = json.loads(data)
        usable(value)
    except RecursionError:
        raise UnusableJSON("", TOO_DEEP) from None
    return value, False


TOO_DEEP = "JSON nested too deeply (about 1,000 levels or more)"


def usable(value: Any, where: str = "") -> None:
    """Raise :class:`UnusableJSON` for the first non-finite number or string with a lone surrogate
    in ``value`` (a value :func:`json.loads` gave)."""
    if isinstance(value, str):
        if not _encodable(value):
            raise UnusableJSON(where, "a string holding a lone UTF-16 surrogate (\\ud800-\\udfff not in a pair)")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise UnusableJSON(where, f"a number JSON cannot carry ({value!r}: NaN, Infinity, or beyond the float range)")
    elif isinstance(value, dict):
        for k, v in value.items():
            at = f"{where}.{k}" if where else str(k)
            if not _encodable(k):
                raise UnusableJSON(where, "a key holding a lone UTF-16 surrogate")
            usable(v, at)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            usable(v, f"{where}[{i}]")


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def dumps(value: Any, fast: bool = True) -> bytes:
    """Compact UTF-8 JSON of ``value`` (see module docstring). Raises ``ValueError`` for a
    non-finite float and ``TypeError`` for a value JSON cannot hold, as ``json.dumps`` does."""
    if fast:
        try:
            return _encoder.encode(value)
        except (TypeError, msgspec.EncodeError, OverflowError):
            pass
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def loads_request(data: bytes, key: str = "messages", arrays: ArrayCache | None = None,
                  check: bool = False) -> tuple[Any, bool]:
    """:func:`loads`, except that when the document is an object whose ``key`` is an array, that
    array's items stay unparsed (``msgspec.Raw``; see module docstring; :func:`item` parses one).
    Every other value, and every document msgspec refuses or that is not such an object, is as
    :func:`loads` gives it. The document must be UTF-8 (``UnicodeDecodeError`` otherwise, as
    :func:`loads` raises); msgspec does not check the bytes of the strings it leaves unparsed,
    so they are checked here first. ``arrays``: split the array with :meth:`ArrayCache.split`
    (the same items; the part a recent request's array already had is not scanned again)."""
    if not data.isascii():
        data.decode("utf-8")
    split = _items.decode if arrays is None else arrays.split
    try:
        top = _fields.decode(data)
        out: dict[str, Any] = {k: split(v) if k == key else _decoder.decode(v) for k, v in top.items()}
        if key not in out:
            raise KeyError(key)
    except (msgspec.DecodeError, KeyError, RecursionError):  # not an object, no such array, or refused: as loads does
        return loads(data, check)
    return out, True


class ArrayCache:
    """The arrays :func:`loads_request` split lately (an LRU of ``size``), each with its items: an
    agent re-sends its whole conversation with one or two more messages each time, so an array
    whose bytes are a recent one's with ``,`` and more items before the closing ``]`` is split
    by reusing that one's items (the same ``msgspec.Raw`` objects, which the session router then
    recognises by identity) and scanning only the rest. An array is looked up by its first
    :data:`KEY_BYTES` bytes (a conversation starts the same way every time); any other array is
    split in full. Either way the items are those ``msgspec`` gives for the whole array: the
    reused prefix is byte for byte an array it split before, less its ``]``. Keeps, per array,
    a copy of its bytes (the next request's is compared with it)."""

    KEY_BYTES = 512

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._arrays: OrderedDict[bytes, tuple[bytes, list[Raw]]] = OrderedDict()
        self._guard = threading.Lock()

    def split(self, array: Raw) -> list[Raw]:
        """The items of ``array`` (the bytes of a JSON array), as ``msgspec.Raw``; raises
        ``msgspec.DecodeError`` when it is not one."""
        data = bytes(array)
        key = data[:self.KEY_BYTES]
        with self._guard:
            known = self._arrays.get(key)
        items: list[Raw] | None = None
        if known is not None:
            before, before_items = known
            n = len(before) - 1  # its bytes up to its closing "]"
            if before_items and len(data) > n + 1 and data[n] == 0x2C and data.startswith(memoryview(before)[:n]):  # 0x2C: ","
                more = _items.decode(b"[" + data[n + 1:])
                if more:  # (none: a "," before the "]", which the full split refuses)
                    items = before_items + more
        if items is None:
            items = _items.decode(data)
        if self.size > 0:
            with self._guard:
                self._arrays[key] = (data, items)
                self._arrays.move_to_end(key)
                while len(self._arrays) > self.size:
                    self._arrays.popitem(last=False)
        return items


def item(value: Any, check: bool = False) -> Any:
    """The value of one item :func:`loads_request` left unparsed (anything else is returned as is),
    with :func:`loads`'s semantics (``ValueError`` when it is not JSON; ``check`` as there)."""
    return loads(bytes(value), check)[0] if isinstance(value, msgspec.Raw) else value


def plain(values: list[Any]) -> list[Any]:
    """``values`` with every unparsed item parsed (for code that reads or edits the messages)."""
    return [item(v) for v in values]
