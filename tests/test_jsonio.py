"""historygraph.providers.jsonio: msgspec on the proxy's request path, the standard library for what
msgspec refuses; values and strings as with ``json``."""

from __future__ import annotations

import json
import math

import pytest

from historygraph.providers import jsonio

DOCS = [b'{"messages": [{"role": "user", "content": "caf\\u00e9 \xc3\xa9 \\ud83d\\ude00 \\n\\t\\"q\\""}]}',
        b'{"a": 1, "a": 2, "n": null, "f": [0.1, 1e-05, -0.0, 12345678901234567890]}',
        b'{"t": NaN, "u": Infinity}',  # msgspec refuses: json's values
        b'{"big": 123456789012345678901234567890}',
        b'{"lone": "\\ud800"}']


@pytest.mark.parametrize("doc", DOCS)
def test_loads_gives_the_values_json_gives(doc):
    value, fast = jsonio.loads(doc)
    expect = json.loads(doc)
    assert json.dumps(value, sort_keys=True) == json.dumps(expect, sort_keys=True)
    assert fast == (b"NaN" not in doc and b"lone" not in doc)  # msgspec keeps big integers exact


def test_loads_raises_as_json_does():
    for bad in (b'{"a": ', b"\xff\xfe{", b"[1,]"):
        with pytest.raises(ValueError):
            jsonio.loads(bad)


def test_dumps_writes_the_bytes_httpx_wrote_for_text():
    value = json.loads(DOCS[0]) | {"tools": [{"name": "x", "schema": {"type": "object"}}], "n": 3, "ok": True}
    assert jsonio.dumps(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def test_dumps_refuses_nan_and_falls_back_for_what_msgspec_cannot_encode():
    with pytest.raises(ValueError):
        jsonio.dumps({"t": math.nan}, fast=False)  # a body that needed json's parser
    big = {"big": 123456789012345678901234567890}
    assert json.loads(jsonio.dumps(big)) == big
    assert jsonio.dumps({"f": 1e-05}) in (b'{"f":1e-05}', b'{"f":0.00001}')  # the same number


def test_loads_request_leaves_each_message_unparsed_and_dumps_copies_its_bytes():
    doc = (b'{"model": "m", "messages": [{"role": "user", "content": "caf\\u00e9"}, {"content": "x",  "role": "assistant"}],'
           b' "tools": [{"type": "function"}], "stream": false}')
    body, fast = jsonio.loads_request(doc)
    assert fast and list(body) == ["model", "messages", "tools", "stream"]  # the client's key order
    assert (body["model"], body["tools"], body["stream"]) == ("m", [{"type": "function"}], False)
    assert [bytes(m) for m in body["messages"]] == [b'{"role": "user", "content": "caf\\u00e9"}',
                                                   b'{"content": "x",  "role": "assistant"}']
    assert jsonio.plain(body["messages"]) == json.loads(doc)["messages"]
    assert json.loads(jsonio.dumps(body)) == json.loads(doc)
    assert b'"caf\\u00e9"' in jsonio.dumps(body)  # forwarded as sent: the escape is the client's own


@pytest.mark.parametrize("doc", DOCS + [b'[1, 2]', b'{"messages": 3}', b'{"a": 1}', b'{"messages": [1e400]}'])
def test_loads_request_is_loads_for_every_other_document(doc):
    value, fast = jsonio.loads_request(doc)
    if isinstance(value, dict) and isinstance(value.get("messages"), list):
        value = {**value, "messages": jsonio.plain(value["messages"])}
    assert json.dumps(value, sort_keys=True) == json.dumps(json.loads(doc), sort_keys=True)


def test_loads_request_checks_the_bytes_it_leaves_unparsed():
    with pytest.raises(UnicodeDecodeError):  # msgspec skips over the inside of a string unchecked
        jsonio.loads_request(b'{"messages": [{"role": "user", "content": "\xff"}]}')
    with pytest.raises(ValueError):
        jsonio.loads_request(b'{"messages": [{"role": "user", "content": NaN}, ]}')


def test_array_cache_splits_as_msgspec_does_and_reuses_a_recent_prefix():
    """ArrayCache.split gives the items msgspec gives for the whole array, whatever came before;
    an array that is a recent one plus more items reuses that one's item objects (not scanned
    again); an edited, shorter or malformed one is split afresh (or refused) as a whole."""
    import msgspec

    whole = msgspec.json.Decoder(list[msgspec.Raw]).decode
    head = b'[{"role": "system", "content": "' + b"s" * 600 + b'"}'
    cache = jsonio.ArrayCache(4)
    first = msgspec.Raw(head + b', {"role": "user", "content": "u"}\n]')
    a = cache.split(first)
    assert [bytes(x) for x in a] == [bytes(x) for x in whole(first)]
    grown = msgspec.Raw(head + b', {"role": "user", "content": "u"}\n, {"role": "assistant", "content": "a"},  1]')
    b = cache.split(grown)
    assert [bytes(x) for x in b] == [bytes(x) for x in whole(grown)] and len(b) == 4
    assert b[0] is a[0] and b[1] is a[1]  # the recent array's items, reused
    for other in (head + b', {"role": "user", "content": "v"}, 2]',  # an earlier item edited
                  head + b']',  # shorter
                  head + b', {"role": "user", "content": "u"}\n, {"role": "assistant", "content": "a"},  1]'):  # the same again
        got = cache.split(msgspec.Raw(other))
        assert [bytes(x) for x in got] == [bytes(x) for x in whole(other)]
    for bad in (head + b', {"role": "user", "content": "u"}\n, {"role": "assistant", "content": "a"},  1,]',
                head + b', {"role": "user", "content": "u"}\n, {"role": "assistant", "content": "a"},  1, {]'):
        with pytest.raises(msgspec.DecodeError):
            whole(bad)
        with pytest.raises(msgspec.DecodeError):
            cache.split(msgspec.Raw(bad))
    body, fast = jsonio.loads_request(b'{"model": "m", "messages": ' + bytes(grown) + b'}', arrays=cache)
    assert fast and [bytes(x) for x in body["messages"]] == [bytes(x) for x in whole(grown)]
