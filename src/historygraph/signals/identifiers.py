"""Identifiers in message text and the IDF-weighted request overlap of ReCAP §3.3.

ReCAP scores a block's relevance to the arriving request by the identifiers they share, weighting
each shared identifier by its inverse document frequency over the historical blocks, so that rare
file names, function names and error symbols dominate common words. The paper does not print the
formula; ours is

    r_t(v) = Σ_{w ∈ I(q) ∩ I(v)} idf(w) / Σ_{w ∈ I(q)} idf(w),   idf(w) = ln((N + 1) / (df(w) + 1)) + 1,

with ``N`` the number of historical blocks and ``df(w)`` the number of them whose identifiers
contain ``w``. ``r`` lies in [0, 1]: 1 when the block contains every identifier of the request.
The smoothed IDF is positive for every word, so a request word absent from history still counts
in the denominator (a request about something never seen is not relevant to anything).

Identifiers ``I(text)``: maximal runs of letters, digits, ``_``, ``.``, ``/``, ``-`` and ``:`` that
start with a letter or ``_`` (``src/app.py``, ``Foo.bar``, ``KeyError``, ``test_x``), with trailing
punctuation stripped, plus each part of such a run split at ``/``, ``:`` and dots (``src/app.py``
also yields ``src`` and ``app``; ``Foo.bar`` yields ``Foo`` and ``bar``). Tokens shorter than
:data:`MIN_LENGTH` characters and a short list of English function words are ignored. Case is kept:
identifiers are case-sensitive in code.
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Sequence

MIN_LENGTH = 3
_RUN = re.compile(r"[A-Za-z_][A-Za-z0-9_./:\-]*")
_SPLIT = re.compile(r"[/:]|(?<=[A-Za-z0-9_])\.(?=[A-Za-z_])")
STOPWORDS = frozenset(
    "the and for are but not you all any can had her was one our out has have this that with from they will "
    "would there their what about which when make like time just know take into your some could them than then "
    "now only its also how use were been more other very these should here where does did".split()
)


def identifiers(text: str) -> set[str]:
    """The identifier set ``I(text)`` (see module docstring)."""
    out: set[str] = set()
    for run in _RUN.findall(text):
        run = run.rstrip(".:-/")
        parts = [run] + [p for p in _SPLIT.split(run) if p != run]
        for p in parts:
            if len(p) >= MIN_LENGTH and p.lower() not in STOPWORDS:
                out.add(p)
    return out


def document_frequency(docs: Iterable[set[str]]) -> dict[str, int]:
    """``df(w)``: the number of identifier sets in ``docs`` that contain ``w``."""
    df: dict[str, int] = {}
    for d in docs:
        for w in d:
            df[w] = df.get(w, 0) + 1
    return df


def idf(word: str, df: dict[str, int], n_docs: int) -> float:
    """Smoothed inverse document frequency ``ln((N + 1) / (df + 1)) + 1``; ≥ 1 whenever ``df ≤ N``."""
    return math.log((n_docs + 1) / (df.get(word, 0) + 1)) + 1.0


def idf_overlap(query: set[str], docs: Sequence[set[str]]) -> list[float]:
    """``r_t(v)`` for every identifier set in ``docs`` against the request identifiers ``query``.

    Returns one value in [0, 1] per document, in order; all zeros when ``query`` is empty. The sums
    are exactly rounded (``math.fsum``): a set's order, and with it a plain float sum's last bit,
    changes with the process's string hash seed, so two blocks with equal overlap tied in one
    process and not in another (ReCAP's selection then differed between runs of the same replay).
    """
    if not query:
        return [0.0] * len(docs)
    df = document_frequency(docs)
    weight = {w: idf(w, df, len(docs)) for w in query}
    total = math.fsum(weight.values())
    return [math.fsum(weight[w] for w in query & d) / total for d in docs]
