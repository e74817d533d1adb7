"""Images, documents, files and audio (issue 38, class 10): stored whole (base64 data byte for byte)
and restorable by id, forwarded unchanged when shown, named by the placeholder of a result left out,
charged to B by the providers' documented estimates (historygraph.signals.media); a result the
client marked ``is_error`` keeps the mark on its placeholder.

Expected token figures are the providers' own worked examples: OpenAI "Images and vision",
"Calculating costs" (1024 × 1024 at high detail: 765; 2048 × 4096: 1105; low detail: 85) and
Anthropic "Vision" (about width × height / 750: 200 × 200 ≈ 54, 1092 × 1092 ≈ 1590). The proxy
tests send hand-built requests at a small budget through the rule-enforcing fake provider
(tests/fake_upstream.py), which rejects media where its API does not take them."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import struct
import wave
import zlib

import httpx

from historygraph import Message, SQLiteStore, TokenCounter
from historygraph.history.events import ToolCall
from historygraph.providers import anthropic as anth
from historygraph.providers import openai_responses as resp
from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig
from historygraph.signals.media import anthropic_image_tokens, describe, image_size, media_tokens, openai_image_tokens


counter = TokenCounter()


def png(width: int, height: int) -> bytes:
    """A valid greyscale PNG of ``width`` × ``height`` pixels (all black)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_image_sizes_are_read_from_their_headers():
    assert image_size(png(200, 100)) == (200, 100)
    assert image_size(b"GIF89a" + struct.pack("<HH", 640, 480) + b"\x00" * 8) == (640, 480)
    # JPEG: SOI, an APP0 segment, then SOF0 with height 300, width 400
    jpeg = b"\xff\xd8" + b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + b"\x00" * 9 \
        + b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, 300, 400, 1) + b"\x01\x11\x00"
    assert image_size(jpeg) == (400, 300)
    assert image_size(b"not an image") is None


def test_the_providers_worked_examples():
    assert openai_image_tokens((1024, 1024)) == 765
    assert openai_image_tokens((2048, 4096)) == 1105
    assert openai_image_tokens((4096, 4096), "low") == 85
    assert openai_image_tokens(None) == 85 + 170 * 8  # size unknown: the most an image can cost
    assert anthropic_image_tokens((200, 200)) == 54  # 40,000 / 750 = 53.3
    assert anthropic_image_tokens((1092, 1092)) == 1590  # 1,192,464 / 750 = 1589.95
    assert anthropic_image_tokens((4000, 3000)) == 1600  # scaled down: at most about 1,600
    assert anthropic_image_tokens(None) == 1600


def test_audio_is_one_token_per_100_ms():
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\x00\x00" * 8000 * 3)  # 3 s
    part = {"type": "input_audio", "input_audio": {"data": b64(buf.getvalue()), "format": "wav"}}
    assert media_tokens(json.dumps([part]), counter.count) == 30


def test_a_chat_image_is_stored_whole_and_charged_by_its_estimate():
    url = "data:image/png;base64," + b64(png(1024, 1024))
    raw = {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                       {"type": "image_url", "image_url": {"url": url, "detail": "high"}}]}
    m = Message.from_openai(raw)
    assert m.content == "what is this?\n[image_url]"
    assert json.loads(m.media) == [raw["content"][1]] and url in m.media  # byte for byte
    assert Message.from_openai(json.loads(json.dumps(m.to_dict()))) == m  # stored and read back
    assert counter.count_message(m) == 3 + counter.count(m.content) + 765
    assert m.with_content("x", "placeholder").media == ""  # a stand-in does not carry it


def test_anthropic_and_responses_media_are_kept_in_results_and_user_messages():
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(png(200, 200))}}
    msgs, _ = anth.to_canonical(None, [
        {"role": "user", "content": [{"type": "text", "text": "look"}, image]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [image]}]}])
    assert [json.loads(m.media) if m.media else [] for m in msgs] == [[image], [], [image]]
    assert counter.count_message(msgs[2]) == 3 + counter.count("[image]") + 54
    part = {"type": "input_image", "image_url": "data:image/png;base64," + b64(png(1024, 1024))}
    msgs, _ = resp.to_canonical(None, [{"role": "user", "content": [{"type": "input_text", "text": "see"}, part]},
                                       {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
                                       {"type": "function_call_output", "call_id": "c1", "output": [part]}])
    assert [json.loads(m.media) if m.media else [] for m in msgs] == [[part], [], [part]]
    assert counter.count_message(msgs[2]) == 3 + counter.count("[input_image]") + 765


LONG = "line of output\n" * 60  # 240 tokens: two such results do not fit in B = 400
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(png(200, 200))}}
PDF = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                      "data": b64(b"%PDF-1.4\n1 0 obj << /Type /Page >> endobj\n%%EOF")}}


def through_proxy(fake: str, tmp_path, path: str, body: dict, sid: str):
    """Send ``body`` through the proxy (B = 400, policy prune); returns (answer, forwarded body,
    rejections, the stored messages, the session API's answers for each result id)."""
    store = SQLiteStore(tmp_path / "media.sqlite")

    async def main():
        # cache_stable off: a first request over B re-selects at 0.75·B, where prune drops the older
        # steps whole; these tests look at the placeholders prune shows at B
        app = create_app(ServerConfig(store=":memory:", policy="prune", budget=400, upstream=fake + "/v1",
                                      anthropic_upstream=fake, calibrate=False, cache_stable=False), store=store)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=30) as c, \
                httpx.AsyncClient(base_url=fake, timeout=30) as up:
            await up.post("/_reset")
            r = await c.post(path, json=body, headers={"X-HistoryGraph-Session": sid})
            seen = (await up.get("/_requests")).json()
            rejected = (await up.get("/_rejections")).json()
            stored = store.messages(sid)
            results = {m.tool_call_id: (await c.get(f"/api/sessions/{sid}/results/{m.tool_call_id}")).json()
                       for m in stored if m.role == "tool"}
        await app.state.proxy.transport.aclose()
        return r, seen[-1]["body"] if seen else None, rejected, stored, results

    try:
        return asyncio.run(main())
    finally:
        store.close()


def test_anthropic_placeholders_keep_is_error_and_name_the_image_restorable_by_id(fake, tmp_path):
    turns = [
        {"role": "user", "content": [{"type": "text", "text": "what broke? here is the screen"}, IMAGE, PDF]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "run", "input": {"cmd": "make"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": "error: " + LONG}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2",
                                      "content": [{"type": "text", "text": LONG}, IMAGE]}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t3", "name": "run", "input": {"cmd": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t3", "content": LONG}]},
    ]
    r, sent, rejected, stored, results = through_proxy(fake, tmp_path, "/v1/messages",
                                                       {"model": "m", "max_tokens": 20, "messages": turns}, "anth-media")
    assert r.status_code == 200, r.text
    assert rejected == []
    out = sent["messages"]
    # the first user turn, its image and PDF forwarded unchanged, with the proxy's breakpoint on the opening's last block
    assert out[0] == {"role": "user", "content": [*turns[0]["content"][:2], {**PDF, "cache_control": {"type": "ephemeral"}}]}
    t1, t2 = out[2]["content"][0], out[4]["content"][0]
    assert t1["tool_use_id"] == "t1" and t1["is_error"] is True and "omitted from this context" in t1["content"]
    assert t2 == {"type": "tool_result", "tool_use_id": "t2", "content": (
        f"[tool result t2 omitted from this context ({counter.count(LONG + chr(10) + '[image]') + 54} tokens, with 1 image); "
        "it is stored in full and can be restored by id]")}
    newest = {**out[6], "content": [dict(out[6]["content"][0])]}
    assert newest["content"][0].pop("cache_control") == {"type": "ephemeral"}  # the proxy's breakpoint on the last message
    assert newest == turns[6]  # the newest result, otherwise shown unchanged
    # stored whole: the user message's image and PDF, the result's image, restorable by id
    assert json.loads(stored[0].media) == [IMAGE, PDF]
    assert results["t2"]["media"] == [IMAGE] and results["t2"]["content"] == LONG + "\n[image]"
    assert results["t1"]["media"] == []


def test_chat_and_responses_images_are_forwarded_unchanged_and_results_restorable(fake, tmp_path):
    url = "data:image/png;base64," + b64(png(1024, 1024))
    image = {"type": "image_url", "image_url": {"url": url}}
    chat = [
        {"role": "user", "content": [{"type": "text", "text": "what is on screen?"}, image]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                               "function": {"name": "run", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": LONG},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c2", "type": "function",
                                                               "function": {"name": "run", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c2", "content": LONG},
    ]
    r, sent, rejected, stored, _ = through_proxy(fake, tmp_path, "/v1/chat/completions", {"model": "m", "messages": chat}, "chat")
    assert r.status_code == 200 and rejected == []
    assert sent["messages"][0] == chat[0] and "omitted" in sent["messages"][2]["content"]
    assert json.loads(stored[0].media) == [image]

    part = {"type": "input_image", "image_url": url, "detail": "low"}  # 85 tokens: the result fits B, two do not
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "what is on screen?"}]},
        {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": LONG}, part]},
        {"type": "function_call", "call_id": "c2", "name": "run", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": LONG},
    ]
    r, sent, rejected, stored, results = through_proxy(fake, tmp_path, "/v1/responses", {"model": "m", "input": items}, "resp")
    assert r.status_code == 200 and rejected == []
    placeholder = sent["input"][2]
    assert placeholder["call_id"] == "c1" and "with 1 image" in placeholder["output"]
    assert sent["input"][4] == items[4]
    assert results["c1"]["media"] == [part]  # restorable whole, base64 and all


def test_the_fake_rejects_media_where_the_api_does_not_take_them():
    from fake_upstream import anthropic_violation, openai_violation

    assert "only allowed in user" in anthropic_violation({"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": [IMAGE]}]})
    bad = {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "AA=="}}
    assert "media_type" in anthropic_violation({"messages": [{"role": "user", "content": [bad]}]})
    assert "is_error" in anthropic_violation({"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "yes", "content": "x"}]}]})
    assert "role tool" in openai_violation([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_the_recall_tool_gives_an_anthropic_results_images_back():
    from types import SimpleNamespace

    from historygraph import MemoryStore
    from historygraph.server.recall_tool import recalled_media

    msgs, _ = anth.to_canonical(None, [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}},
                                          {"type": "tool_use", "id": "t2", "name": "run", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "x"}, IMAGE]},
                                     {"type": "tool_result", "tool_use_id": "t2", "content": "plain"}]}])
    store = MemoryStore()
    store.create_session("s")
    store.append("s", msgs)
    proxy = SimpleNamespace(store=store)
    assert recalled_media(proxy, "s", json.dumps({"ids": ["t1", "t2"]})) == [IMAGE]
    assert recalled_media(proxy, "s", json.dumps({"ids": ["t2", "nope"]})) == []
    assert recalled_media(proxy, "s", "not json") == []


# -- issue 50: a malformed media part is refused, never stored; one stored before still renders ----------

def _call(cid: str) -> dict:
    return {"role": "assistant", "content": [{"type": "tool_use", "id": cid, "name": "shot", "input": {}}]}


BAD_MEDIA = {  # name: (path, request body, what the 400 must name)
    "anthropic image, source a string": ("/v1/messages", {"model": "m", "max_tokens": 20, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image", "source": "aGk="}]}]},
        "messages[0].content[1] (image): its source must be an object"),
    "anthropic document, source a list": ("/v1/messages", {"model": "m", "max_tokens": 20, "messages": [
        {"role": "user", "content": [{"type": "document", "source": ["aGk="]}, {"type": "text", "text": "read"}]}]},
        "messages[0].content[0] (document): its source must be an object"),
    "anthropic image inside a tool_result, source a list": ("/v1/messages", {"model": "m", "max_tokens": 20, "messages": [
        {"role": "user", "content": "go"}, _call("t1"),
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "x"}, {"type": "image", "source": ["a", "b"]}]}]}]},
        "messages[2].content[0].content[1] (image): its source must be an object"),
    "chat input_audio a string": ("/v1/chat/completions", {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "input_audio", "input_audio": "UklGRg=="}]}]},
        "content[0] (input_audio): its input_audio must be an object"),
    "chat input_audio a list": ("/v1/chat/completions", {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hear"}, {"type": "input_audio", "input_audio": ["UklGRg=="]}]}]},
        "content[1] (input_audio): its input_audio must be an object"),
}


def test_a_malformed_media_part_is_a_400_naming_it_and_nothing_is_stored(tmp_path):
    """Issue 50: the message was stored, then token counting raised AttributeError: the client got
    500, and so did every later request of the session, its /render and count_tokens."""
    store = SQLiteStore(tmp_path / "bad-media.sqlite")
    forwarded: list[str] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        forwarded.append(request.url.path)
        return httpx.Response(500)

    async def main():
        app = create_app(ServerConfig(store=":memory:", policy="prune", upstream="http://up/v1",
                                      anthropic_upstream="http://up"), store=store)
        app.state.proxy.transport = httpx.MockTransport(upstream)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=30) as c:
            for n, (name, (path, body, where)) in enumerate(BAD_MEDIA.items()):
                sid = f"bad-media-{n}"
                r = await c.post(path, json=body, headers={"X-HistoryGraph-Session": sid})
                assert r.status_code == 400, (name, r.text)
                error = r.json()["error"]
                assert where in error["message"] and error["type"] == "invalid_request_error", (name, error)
                assert not store.has_session(sid), name
                if path == "/v1/messages":
                    r = await c.post("/v1/messages/count_tokens", json={"model": "m", "messages": body["messages"]})
                    assert r.status_code == 400 and where in r.json()["error"]["message"], (name, r.text)
                else:  # the session API reads OpenAI form as the proxy does
                    r = await c.post(f"/api/sessions/{sid}/events", json={"messages": body["messages"], "create": True})
                    assert r.status_code == 400 and where in r.json()["detail"], (name, r.text)
                    assert not store.has_session(sid), name
        await app.state.proxy.transport.aclose()

    try:
        asyncio.run(main())
    finally:
        store.close()
    assert forwarded == []


def test_the_library_refuses_a_malformed_media_part_with_event_error():
    import pytest

    from historygraph import render_anthropic_messages, render_messages
    from historygraph.history.events import EventError

    for path, body, where in BAD_MEDIA.values():
        render = render_anthropic_messages if path == "/v1/messages" else render_messages
        with pytest.raises(EventError, match=re.escape(where)):
            render(body["messages"], budget=4000, policy="prune")
    with pytest.raises(EventError, match=r"input\[0\]\.content\[0\] \(input_audio\): its input_audio must be an object"):
        resp.to_canonical(None, [{"role": "user", "content": [{"type": "input_audio", "input_audio": "x"}]}])


def test_a_malformed_part_stored_by_an_earlier_release_is_counted_as_its_text_and_the_session_renders(tmp_path):
    """Issue 50: such a part, once stored, made every rendering of its session fail for good."""
    bad = [{"source": "aGk=", "type": "image"}, {"input_audio": ["UklGRg=="], "type": "input_audio"}]
    media = json.dumps(bad, sort_keys=True, separators=(",", ":"))
    for part in bad:  # its compact JSON counted as text
        assert media_tokens(json.dumps([part]), counter.count) == counter.count(
            json.dumps(part, sort_keys=True, separators=(",", ":")))
    assert media_tokens("not json", counter.count) == counter.count("not json")
    assert describe(media) == "1 image, 1 audio clip" and describe("not json") == "unreadable media"
    store = SQLiteStore(tmp_path / "old.sqlite")
    store.create_session("old")
    store.append("old", [Message("user", "look\n[image]\n[input_audio]", media=media),
                         Message("assistant", "", (ToolCall("t1", "shot"),)),
                         Message("tool", LONG + "[image]", tool_call_id="t1", media=media), Message("user", "and?")])

    async def main():
        app = create_app(ServerConfig(store=":memory:", policy="prune"), store=store)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy", timeout=30) as c:
            r = await c.post("/api/sessions/old/render", json={"budget": 4000})
            assert r.status_code == 200, r.text
            small = await c.post("/api/sessions/old/render", json={"budget": 300})
            assert small.status_code == 200 and small.json()["omitted_ids"] == ["t1"], small.text
            assert "t1" in small.json()["messages"][2]["content"]  # an excerpt naming it
            assert (await c.get("/api/sessions/old/results/t1")).json()["media"] == bad  # kept whole

    try:
        asyncio.run(main())
    finally:
        store.close()
