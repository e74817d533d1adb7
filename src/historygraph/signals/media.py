"""Token estimates of non-text content parts (images, documents, files, audio), which providers bill
by pixel area, pages or duration, not by their bytes (a text tokenizer over their base64 would count
hundreds of times too many). :meth:`TokenCounter.count_message` adds :func:`media_tokens` of a
message's :attr:`~historygraph.history.events.Message.media`, so B covers them (docs/architecture.md,
invariant §5.8).

Sources (each estimate rounds up, so a rendering counted with them stays within B):

* Anthropic images (``image`` blocks): about ``width × height / 750`` tokens, after an image whose
  long edge exceeds 1568 px is scaled down to it, and at most about 1,600 tokens (larger images are
  scaled down to that); "Vision", https://docs.anthropic.com/en/docs/build-with-claude/vision
  ("Evaluate image size"). Size unknown (a URL, a file id, bytes we cannot read): 1,600.
* OpenAI images (Chat Completions ``image_url``, Responses ``input_image``): ``detail: "low"`` costs
  85 tokens; otherwise the image is scaled to fit 2048 × 2048, then its shortest side to 768 px,
  and costs 85 + 170 per 512-px tile; "Images and vision", "Calculating costs",
  https://platform.openai.com/docs/guides/images-vision (its worked examples: 1024 × 1024 → 765,
  2048 × 4096 → 1105). Size unknown: the most any image can cost, 85 + 170 × 8 = 1445.
* PDF documents and files (Anthropic ``document``, Chat ``file``, Responses ``input_file``): each
  page is given to the model as its text and as an image; "PDF support",
  https://docs.anthropic.com/en/docs/build-with-claude/pdf-support: "1,500-3,000 tokens per page"
  of text, plus the page's image. Estimate: 3,000 + the provider's unknown-size image cost per
  page; the pages are the PDF's ``/Type /Page`` objects (one when none is found: compressed
  object streams hide them, or the file is not given inline). A plain-text document source is
  counted as its text.
* Audio (Chat ``input_audio``): 1 token per 100 ms of audio ("Managing costs" of the Realtime API,
  https://platform.openai.com/docs/guides/realtime-costs); the duration of a WAV file is read from
  its header, of anything else taken at 32 kbit/s (the lowest common MP3 bit rate, which gives the
  longest duration for its size).
* Gemini ``inlineData`` parts (stored as ``{"type": "inlineData", "inlineData": {"mimeType",
  "data"}}``); Google's Gemini API documentation, "Understand and count tokens"
  (https://ai.google.dev/gemini-api/docs/tokens) and "Document understanding": an image with both
  sides at most 384 px is 258 tokens, a larger one is cut into 768 × 768 tiles of 258 tokens each;
  audio is 32 tokens per second (its duration read as for Chat ``input_audio``); a PDF is 258
  tokens per page; a ``text/*`` part is counted as its text. A part none of these reads (video,
  whose duration the bytes do not give, an image format whose size is not read) is counted as
  its base64 text, more than the provider charges.
* A part none of these reads: an ``image`` or ``document`` whose ``source``, or an ``input_audio``
  whose ``input_audio``, is not an object (no provider takes it; a request holding one is refused
  with ``EventError`` since issue 50, but an earlier release stored such parts), and ``media`` that
  is not a JSON list of parts: counted as their compact JSON text (:func:`malformed_tokens`), so
  that such a session still renders and is charged at least what its text would cost.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import re
import struct
import wave
from typing import Any, Callable

ANTHROPIC_IMAGE_MAX = 1600
ANTHROPIC_LONG_EDGE = 1568
OPENAI_LOW = 85
OPENAI_TILE = 170
OPENAI_IMAGE_MAX = OPENAI_LOW + OPENAI_TILE * 8
PDF_PAGE_TEXT = 3000
AUDIO_TOKENS_PER_S = 10
AUDIO_BYTES_PER_S = 4000  # 32 kbit/s
GEMINI_TILE = 258
GEMINI_SMALL = 384
GEMINI_TILE_PX = 768
GEMINI_AUDIO_TOKENS_PER_S = 32



def image_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` in pixels of a PNG, GIF, JPEG or WebP image from its bytes (its header
    only), ``None`` for anything else."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:4] == b"GIF8" and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        chunk = data[12:16]
        if chunk == b"VP8X":
            return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
        if chunk == b"VP8 ":
            w, h = struct.unpack("<HH", data[26:30])
            return w & 0x3FFF, h & 0x3FFF
        if chunk == b"VP8L":
            bits = int.from_bytes(data[21:25], "little")
            return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
        return None
    if data[:2] == b"\xff\xd8":  # JPEG: the first start-of-frame segment holds the size
        i = 2
        while i + 9 <= len(data):
            if data[i] != 0xFF:
                return None
            marker = data[i + 1]
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
                i += 2
                continue
            length = struct.unpack(">H", data[i + 2:i + 4])[0]
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                h, w = struct.unpack(">HH", data[i + 5:i + 9])
                return w, h
            i += 2 + length
    return None


def anthropic_image_tokens(size: tuple[int, int] | None) -> int:
    """Tokens of an Anthropic image of ``size`` (module docstring); ``None``: size unknown."""
    if size is None:
        return ANTHROPIC_IMAGE_MAX
    w, h = size
    scale = min(1.0, ANTHROPIC_LONG_EDGE / max(w, h, 1))
    return min(ANTHROPIC_IMAGE_MAX, math.ceil(w * scale * h * scale / 750))


def openai_image_tokens(size: tuple[int, int] | None, detail: str | None = None) -> int:
    """Tokens of an OpenAI image of ``size`` at ``detail`` (module docstring); ``None``: unknown."""
    if detail == "low":
        return OPENAI_LOW
    if size is None:
        return OPENAI_IMAGE_MAX
    w, h = float(size[0]), float(size[1])
    scale = min(1.0, 2048 / max(w, h, 1))
    w, h = w * scale, h * scale
    scale = min(1.0, 768 / max(min(w, h), 1))
    w, h = w * scale, h * scale
    return OPENAI_LOW + OPENAI_TILE * math.ceil(w / 512) * math.ceil(h / 512)


def gemini_image_tokens(size: tuple[int, int]) -> int:
    """Tokens of a Gemini image of ``size`` (module docstring)."""
    w, h = size
    if w <= GEMINI_SMALL and h <= GEMINI_SMALL:
        return GEMINI_TILE
    return GEMINI_TILE * math.ceil(w / GEMINI_TILE_PX) * math.ceil(h / GEMINI_TILE_PX)


def gemini_inline_tokens(part: dict[str, Any], count: Callable[[str], int]) -> int:
    """Tokens of a Gemini ``inlineData`` part by its ``mimeType`` (module docstring)."""
    spec = part.get("inlineData")
    if not isinstance(spec, dict):
        return malformed_tokens(part, count)
    mime, raw = str(spec.get("mimeType") or ""), _decoded(spec.get("data"))
    if mime.startswith("image/") and raw and (size := image_size(raw)) is not None:
        return gemini_image_tokens(size)
    if mime.startswith("audio/") and raw:
        fmt = "wav" if mime in ("audio/wav", "audio/x-wav") else mime
        return math.ceil(GEMINI_AUDIO_TOKENS_PER_S * audio_seconds(raw, fmt))
    if mime == "application/pdf" and raw:
        return pdf_pages(raw) * GEMINI_TILE
    if mime.startswith("text/") and raw is not None:
        return count(raw.decode("utf-8", "replace"))
    return malformed_tokens(str(spec.get("data", "")), count)


def _decoded(data: Any) -> bytes | None:
    """The bytes of base64 ``data`` (a data URL's payload too), ``None`` when it is not that."""
    if not isinstance(data, str):
        return None
    if data.startswith("data:"):
        data = data.partition(",")[2]
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        return None


_PAGE = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")


def pdf_pages(data: bytes | None) -> int:
    """Pages of a PDF counted as its ``/Type /Page`` objects; 1 when none is found."""
    return max(1, len(_PAGE.findall(data))) if data else 1


def audio_seconds(data: bytes | None, fmt: Any) -> float:
    """Duration of audio ``data`` in ``fmt`` (module docstring); 0 without data."""
    if not data:
        return 0.0
    if fmt == "wav":
        try:
            with wave.open(io.BytesIO(data)) as w:
                return w.getnframes() / float(w.getframerate())
        except (wave.Error, EOFError, ZeroDivisionError):
            pass
    return len(data) / AUDIO_BYTES_PER_S


def malformed_tokens(value: Any, count: Callable[[str], int]) -> int:
    """Tokens of a media part (or ``media`` text) none of the estimates reads: its compact JSON
    text, counted by ``count`` (module docstring)."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return count(text)


def part_tokens(part: Any, count: Callable[[str], int]) -> int:
    """Tokens of one media content part (module docstring); ``count`` counts text."""
    if not isinstance(part, dict):
        return 0
    kind = part.get("type")
    body = part.get("input_audio" if kind == "input_audio" else "source")
    if kind in ("image", "document", "input_audio") and body is not None and not isinstance(body, dict):
        return malformed_tokens(part, count)
    if kind == "image":
        source = part.get("source") or {}
        raw = _decoded(source.get("data")) if source.get("type") == "base64" else None
        return anthropic_image_tokens(image_size(raw) if raw else None)
    if kind in ("image_url", "input_image"):
        spec = part.get("image_url")
        url = spec.get("url") if isinstance(spec, dict) else spec
        detail = (spec.get("detail") if isinstance(spec, dict) else None) or part.get("detail")
        raw = _decoded(url) if isinstance(url, str) and url.startswith("data:") else None
        return openai_image_tokens(image_size(raw) if raw else None, detail)
    if kind == "document":
        source = part.get("source") or {}
        if source.get("type") == "text":
            return count(str(source.get("data", "")))
        if source.get("type") == "content":
            return count(json.dumps(source.get("content"), ensure_ascii=False))
        raw = _decoded(source.get("data")) if source.get("type") == "base64" else None
        return pdf_pages(raw) * (PDF_PAGE_TEXT + ANTHROPIC_IMAGE_MAX)
    if kind in ("file", "input_file"):
        spec = part.get("file") if kind == "file" else part
        raw = _decoded(spec.get("file_data")) if isinstance(spec, dict) else None
        return pdf_pages(raw) * (PDF_PAGE_TEXT + OPENAI_IMAGE_MAX)
    if kind == "inlineData":
        return gemini_inline_tokens(part, count)
    if kind == "input_audio":
        spec = part.get("input_audio") or {}
        return math.ceil(AUDIO_TOKENS_PER_S * audio_seconds(_decoded(spec.get("data")), spec.get("format")))
    return 0


def media_tokens(media: str, count: Callable[[str], int]) -> int:
    """Tokens of :attr:`Message.media` (compact JSON of media parts): the sum of :func:`part_tokens`."""
    if not media:
        return 0
    try:
        parts = json.loads(media)
    except ValueError:
        parts = None
    if not isinstance(parts, list):
        return malformed_tokens(media, count)
    return sum(part_tokens(p, count) for p in parts)


def describe(media: str) -> str:
    """What ``media`` holds, for a placeholder: ``"1 image"``, ``"2 images, 1 document"`` …"""
    kinds: dict[str, int] = {}
    try:
        parts = json.loads(media) if media else []
    except ValueError:
        parts = None
    if not isinstance(parts, list):
        return "unreadable media"
    for p in parts:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind == "inlineData":
            mime = str((p.get("inlineData") or {}).get("mimeType") or "") if isinstance(p.get("inlineData"), dict) else ""
            kind = "image" if mime.startswith("image/") else "input_audio" if mime.startswith("audio/") else "file"
        word = ("image" if kind in ("image", "image_url", "input_image") else "audio clip" if kind == "input_audio"
                else "document" if kind == "document" else "file")
        kinds[word] = kinds.get(word, 0) + 1
    return ", ".join(f"{n} {w}{'s' if n > 1 else ''}" for w, n in kinds.items())
