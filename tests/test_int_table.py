"""IntTable: a tabulated function of integers, with the bits of the per-item formula."""

import math

import numpy as np

from historygraph.signals.int_table import IntTable


def test_values_are_the_per_item_formula_bit_for_bit_and_the_table_grows():
    t = IntTable(lambda i: 0.8 ** i)
    xs = np.array([0, 3, 1, 70, 3])
    assert t(xs).tolist() == [0.8 ** 0, 0.8 ** 3, 0.8 ** 1, 0.8 ** 70, 0.8 ** 3]
    assert len(t.values) >= 71
    logs = IntTable(math.log1p)(np.arange(1000))
    assert logs.tolist() == [math.log1p(i) for i in range(1000)]
    assert IntTable(math.log1p)(np.zeros(0, dtype=np.int64)).shape == (0,)


class _Racing(IntTable):
    """Another thread's put of a shorter table lands right after this call puts the table it grew."""

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name == "values" and len(value) > 64:  # type: ignore[arg-type]
            object.__setattr__(self, "values", value[:10])  # type: ignore[index]


def test_a_call_reads_the_table_it_grew_whatever_another_thread_put_since():
    t = _Racing(math.log1p)
    assert t(np.array([3000, 2])).tolist() == [math.log1p(3000), math.log1p(2)]
    assert len(t.values) == 10  # the other thread's table, shorter: the next call grows it again
    assert t(np.array([500])).tolist() == [math.log1p(500)]
