"""Speed only: :class:`Grow`, an int64 array grown by appending (amortised O(1)), for per-graph
state extended as a graph grows. It must equal ``np.asarray`` of the list of the values appended
(after the truncations); a reader may skip this module."""

from __future__ import annotations

from typing import Iterable

import numpy as np

class Grow:
    """An int64 array grown by appending (amortised O(1)) and cut back by :meth:`truncate`.
    :meth:`view` hands out a view of the filled part; a truncation first copies the buffer, so a
    view handed out earlier keeps its values (a render may still be reading it)."""

    __slots__ = ("buf", "n", "pending")

    def __init__(self, values: Iterable[int] | np.ndarray = (), collect: bool = False) -> None:
        vals = values if isinstance(values, np.ndarray) else list(values)
        self.buf = np.zeros(max(64, 2 * len(vals)), dtype=np.int64)
        self.buf[:len(vals)] = vals
        self.n = len(vals)
        # with ``collect``, appends go to a list until :meth:`flush` (a build from scratch appends thousands)
        self.pending: list[int] | None = [] if collect else None

    def flush(self) -> None:
        if self.pending is not None:
            vals, self.pending = self.pending, None
            grown = Grow(self.buf[:self.n].tolist() + vals)
            self.buf, self.n = grown.buf, grown.n

    def append(self, value: int) -> None:
        if self.pending is not None:
            self.pending.append(value)
            return
        if self.n == len(self.buf):
            grown = np.zeros(2 * len(self.buf), dtype=np.int64)
            grown[:self.n] = self.buf
            self.buf = grown
        self.buf[self.n] = value
        self.n += 1

    def extend(self, values: list[int]) -> None:
        if self.pending is not None:
            self.pending.extend(values)
            return
        if self.n + len(values) > len(self.buf):
            grown = np.zeros(max(2 * len(self.buf), 2 * (self.n + len(values))), dtype=np.int64)
            grown[:self.n] = self.buf[:self.n]
            self.buf = grown
        self.buf[self.n:self.n + len(values)] = values
        self.n += len(values)

    def truncate(self, n: int) -> None:
        if n < self.n:
            self.buf = self.buf.copy()
            self.n = n

    def view(self) -> np.ndarray:
        return self.buf[:self.n]
