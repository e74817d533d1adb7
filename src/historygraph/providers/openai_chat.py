"""The messages of an OpenAI Chat Completions request, read as canonical events lazily.

The canonical :class:`~historygraph.history.events.Message` is the OpenAI form, so a chat
request's messages need no conversion, only parsing; the proxy's OpenAI endpoint leaves each item
of the ``messages`` array unparsed (:func:`historygraph.providers.jsonio.loads_request`) and
:class:`RequestMessages` parses a message only when it is read. The session router reads the
items themselves (``raw``) to recognise the prefix it stored last time without parsing it
(:meth:`historygraph.history.sessions.SessionRouter.ingest`, "Incremental comparison").
"""

from __future__ import annotations

from typing import Any, Sequence, overload

from historygraph.history.events import EventError, Message
from historygraph.providers import jsonio


class MessageError(EventError):
    """A request message that cannot be parsed; ``index`` is its position in the request."""

    def __init__(self, index: int, exc: EventError) -> None:
        super().__init__(f"messages[{index}]: {exc}")
        self.index, self.reason = index, str(exc)


class RequestMessages(Sequence[Message]):
    """The messages of one request in OpenAI form (``developer`` read as ``system``), each parsed
    when first read and at most once; ``raw`` keeps the client's JSON objects, or their unparsed
    bytes (``msgspec.Raw`` items of :func:`historygraph.providers.jsonio.loads_request`; see
    "Incremental comparison" in :mod:`historygraph.history.sessions`, whose
    :meth:`~historygraph.history.sessions.SessionRouter.ingest` reads ``raw``). ``read_as``:
    positions whose message stands for another event (a client's text echo of a tool call and its
    output, :mod:`historygraph.providers.text_calls`), read as that event.

    Raises (on reading a message): :class:`MessageError` naming the message that is invalid.
    """

    def __init__(self, raw: list[Any], read_as: dict[int, Message] | None = None) -> None:
        self.raw = raw
        self._parsed: list[Message | None] = [None] * len(raw)
        for i, m in (read_as or {}).items():
            self._parsed[i] = m

    def __len__(self) -> int:
        return len(self.raw)

    @overload
    def __getitem__(self, i: int) -> Message: ...

    @overload
    def __getitem__(self, i: slice) -> list[Message]: ...

    def __getitem__(self, i: int | slice) -> Message | list[Message]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self.raw)))]
        m = self._parsed[i]
        if m is None:
            try:
                m = self._parsed[i] = Message.from_openai(jsonio.item(self.raw[i], check=True))
            except ValueError as exc:  # EventError, an unparsed item that is not JSON, or holds what no provider reads
                raise MessageError(i if i >= 0 else len(self.raw) + i,
                                   exc if isinstance(exc, EventError) else EventError(
                                       str(exc) if isinstance(exc, jsonio.UnusableJSON) else f"not valid JSON: {exc}")) from None
        return m

    def parse_all(self) -> list[Message]:
        """Every message, parsed (raises :class:`MessageError` for the first invalid one)."""
        return self[:]
