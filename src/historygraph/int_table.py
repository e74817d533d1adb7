"""A function of non-negative integers, tabulated: computed once per integer by Python's own
:mod:`math` (or ``**``) and looked up by numpy, so that an array of results holds the same bits as
the per-item formula (numpy's ``log1p``, ``exp`` or ``power`` may round differently)."""

from __future__ import annotations

from typing import Callable

import numpy as np


class IntTable:
    """``fn(i)`` for each integer ``i ≥ 0`` of an array; shape as the array's, float64. The table
    grows (at least doubling) when a larger integer is asked for."""

    def __init__(self, fn: Callable[[int], float]) -> None:
        self.fn = fn
        self.values = np.zeros(0)

    def __call__(self, ints: np.ndarray) -> np.ndarray:
        idx = np.asarray(ints).astype(np.intp)
        if not idx.size:
            return np.zeros(idx.shape)
        top = int(idx.max()) + 1
        if top > len(self.values):
            k = len(self.values)
            self.values = np.concatenate([self.values, [self.fn(i) for i in range(k, max(top, 2 * k, 64))]])
        return self.values[idx]
