"""A function of non-negative integers, tabulated: computed once per integer by Python's own
:mod:`math` (or ``**``) and looked up by numpy, so that an array of results holds the same bits as
the per-item formula (numpy's ``log1p``, ``exp`` or ``power`` may round differently)."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np


class IntTable:
    """``fn(i)`` for each integer ``i ≥ 0`` of an array; shape as the array's, float64. The table
    grows (at least doubling) when a larger integer is asked for. Safe to share between threads
    (renders of several sessions): a call reads the table it grew, and a table another thread put
    meanwhile holds the same values, however long."""

    def __init__(self, fn: Callable[[int], float]) -> None:
        self.fn = fn
        self.values = np.zeros(0)

    def __call__(self, ints: np.ndarray) -> np.ndarray:
        idx = np.asarray(ints).astype(np.intp)
        if not idx.size:
            return np.zeros(idx.shape)
        top = int(idx.max()) + 1
        values = self.values
        if top > len(values):
            k = len(values)
            values = self.values = np.concatenate([values, [self.fn(i) for i in range(k, max(top, 2 * k, 64))]])
        return values[idx]


#: ``ln(1 + i)`` (:func:`math.log1p`), shared by every caller (the learned features, the step view's parent scores)
LOG1P = IntTable(math.log1p)
