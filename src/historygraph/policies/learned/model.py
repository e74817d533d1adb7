"""The reuse model of the learned selector: a small JSON file, read with numpy alone.

A model maps the render-time features of :mod:`historygraph.policies.learned.features` to the probability that
a tool result is reused at the next invocation. Two kinds of file:

* ``"kind": "logistic"`` (:class:`ReuseModel`), a logistic regression over standardised features::

    {"format": "historygraph-reuse-model", "version": 1, "kind": "logistic",
     "features": [...], "mean": [...], "scale": [...], "coef": [...], "intercept": x,
     "meta": {...}}

  ``p = 1 / (1 + e^{−(b + Σ_k w_k (x_k − μ_k) / σ_k)})``.
* ``"kind": "trees"`` (:class:`TreeReuseModel`), an ensemble of regression trees (LightGBM's
  LambdaRank objective, ``historygraph fit --objective lambdarank``, :mod:`historygraph.policies.learned.train`) with a logistic
  calibration of its score: ``p = 1 / (1 + e^{−(a·s + b)})``, ``s`` the sum over trees of the leaf
  each row reaches (a node sends ``x`` left when ``x[feature] ≤ threshold``)::

    {"format": "historygraph-reuse-model", "version": 1, "kind": "trees", "features": [...],
     "roots": [...], "feature": [...], "threshold": [...], "left": [...], "right": [...],
     "value": [...], "calibration": [a, b], "meta": {...}}

  Nodes of every tree are numbered in one sequence; a leaf has ``feature`` −1 and its ``value``.
  Scoring uses leaf bitmasks (:class:`LeafMasks`, QuickScorer's exit-leaf rule) for trees of up to
  64 leaves, a level-by-level walk otherwise; both give the same bits. A render's scores are kept
  per result for the graph's next render (:class:`ScoreMemo`), which scores again only the rows
  whose bins changed.
* ``"kind": "blend"`` (:class:`BlendReuseModel`), a weighted mean of the probabilities of other
  models (``historygraph fit --objective blend``: the logistic regression and LambdaRank trees)::

    {"format": "historygraph-reuse-model", "version": 1, "kind": "blend", "features": [...],
     "weights": [w_1, ...], "models": [{a logistic or trees model}, ...], "meta": {...}}

  ``p = Σ_i w_i p_i`` with ``Σ_i w_i = 1``.

``meta`` records what it was fitted on and how (trajectories, rows, the command). Fitting needs
scikit-learn, and LightGBM for trees (:mod:`historygraph.policies.learned.train`); loading and predicting need
numpy alone.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from historygraph.policies.learned.features import FEATURES

FORMAT = "historygraph-reuse-model"
VERSION = 1
DIGITS = 5  # significant digits stored: lbfgs fits agree to about 6 across machines and BLAS builds
DEFAULT_MODEL = "default_model.json"  # shipped in this package, fitted by `historygraph fit` (docs/results.md)


class ReuseModelError(ValueError):
    """A model file that cannot be used (names the file and what is wrong)."""


@dataclass
class ReuseModel:
    """A fitted reuse model (see module docstring). Arrays have one entry per feature."""

    features: list[str]
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    meta: dict[str, Any] = field(default_factory=dict)

    def predict(self, X: np.ndarray, keys: "np.ndarray | None" = None, owner: Any = None) -> np.ndarray:
        """Reuse probabilities for feature rows ``X`` of shape ``(n, len(features))``; shape ``(n,)``.
        ``keys`` and ``owner`` are those of :meth:`TreeReuseModel.predict`, taken so that every kind
        is called alike; nothing is kept (every row's age, so its linear score, changes each render)."""
        z = np.subtract(X, self.mean)  # ((X − μ) / σ) · w + b, the standardised copy divided in place
        np.divide(z, self.scale, out=z)
        z = z @ self.coef
        z += self.intercept
        return 1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))

    def to_dict(self) -> dict[str, Any]:
        def r(a: np.ndarray) -> list[float]:
            return [float(f"{x:.{DIGITS}g}") for x in a]
        return {"format": FORMAT, "version": VERSION, "kind": "logistic", "features": list(self.features),
                "mean": r(self.mean), "scale": r(self.scale), "coef": r(self.coef),
                "intercept": float(f"{self.intercept:.{DIGITS}g}"), "meta": self.meta}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "model") -> "AnyReuseModel":
        """The model a file's contents describe (any kind of the module docstring).

        Raises:
            ReuseModelError: wrong format, version, kind, features or array shapes.
        """
        if d.get("format") != FORMAT:
            raise ReuseModelError(f"{source}: not a historygraph reuse model (format {d.get('format')!r}, expected {FORMAT!r})")
        if d.get("version") != VERSION or d.get("kind") not in KINDS:
            raise ReuseModelError(f"{source}: unsupported model version {d.get('version')!r} / kind {d.get('kind')!r} "
                             f"(this historygraph reads version {VERSION}, kind {' or '.join(map(repr, KINDS))}); "
                             f"re-fit it with `historygraph fit`")
        if list(d.get("features", ())) != list(FEATURES):
            missing = sorted(set(FEATURES) - set(d.get("features", ())))
            raise ReuseModelError(f"{source}: its features differ from this version's ({', '.join(missing) or 'order'}); "
                             f"re-fit it with `historygraph fit`")
        if d["kind"] == "trees":
            return TreeReuseModel.from_dict(d, source)
        if d["kind"] == "blend":
            return BlendReuseModel.from_dict(d, source)
        arr = {k: np.asarray(d[k], dtype=float) for k in ("mean", "scale", "coef")}
        if any(a.shape != (len(FEATURES),) for a in arr.values()):
            raise ReuseModelError(f"{source}: mean/scale/coef must each have {len(FEATURES)} entries")
        return cls(list(d["features"]), arr["mean"], arr["scale"], arr["coef"], float(d["intercept"]), dict(d.get("meta", {})))

    @classmethod
    def load(cls, path: str | Path | None = None) -> "AnyReuseModel":
        """Load a model file; ``None`` or ``""`` loads the default model shipped in the package.

        Raises:
            ReuseModelError: unreadable file, wrong format, version or features.
        """
        if not path:
            text = resources.files(__package__).joinpath(DEFAULT_MODEL).read_text()
            return cls.from_dict(json.loads(text), f"shipped {DEFAULT_MODEL}")
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ReuseModelError(f"cannot read reuse model {path}: {exc}") from None
        return cls.from_dict(d, str(path))


KINDS = ("logistic", "trees", "blend")


@dataclass
class TreeReuseModel:
    """A fitted tree ensemble with a logistic calibration (module docstring). Node arrays have one
    entry per node of all trees; ``roots`` one per tree; ``calibration`` is ``(a, b)``."""

    features: list[str]
    roots: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray
    calibration: tuple[float, float]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        leaf = self.feature < 0
        # a leaf points to itself, so every row can take the same number of steps; children interleaved:
        # node k's left child at 2k, its right child at 2k + 1
        own = np.arange(len(self.feature))
        self._kids = np.stack([np.where(leaf, own, self.left), np.where(leaf, own, self.right)], axis=1).ravel().astype(np.intp)
        self._feature = np.where(leaf, 0, self.feature).astype(np.intp)
        self._threshold = np.where(leaf, np.inf, self.threshold)
        self._depth = self._max_depth()
        self._masks = LeafMasks.build(self)
        self._memos: "weakref.WeakKeyDictionary[Any, ScoreMemo]" = weakref.WeakKeyDictionary()

    def _max_depth(self) -> int:
        depth, level = 0, np.asarray(self.roots, dtype=np.intp)
        while len(level := level[self.feature[level] >= 0]):
            level = np.concatenate([self.left[level], self.right[level]]).astype(np.intp)
            depth += 1
            if depth > len(self.feature):
                raise ReuseModelError("tree model: a cycle in the node arrays (re-fit it with `historygraph fit`)")
        return depth

    def score(self, X: np.ndarray, keys: "np.ndarray | None" = None, owner: Any = None) -> np.ndarray:
        """The ensemble's raw score for feature rows ``X`` of shape ``(n, len(features))``; shape ``(n,)``:
        per row, the sum over trees (in tree order, numpy's pairwise sum of the ``(n, trees)`` leaf
        values) of the leaf the row reaches. :class:`LeafMasks` finds the leaves when every tree has
        at most 64; :meth:`score_levels` otherwise. Both give the same bits.

        ``keys`` (distinct integers ≥ 0, one per row) and ``owner`` (an object that can be weakly
        referenced, e.g. the graph whose results the rows are): the scores are kept per key for the
        next call with the same owner, and a row whose bins are its key's last ones is not scored
        again (:class:`ScoreMemo`; the same bits)."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        if self._masks is None:
            return self.score_levels(X)
        if keys is not None and owner is not None:
            memo = self._memos.get(owner)
            if memo is None:
                memo = self._memos[owner] = ScoreMemo(self._masks)
            return memo.score(X, keys)
        return self._masks.leaf_values(X).sum(axis=1)

    def score_levels(self, X: np.ndarray) -> np.ndarray:
        """:meth:`score` by walking: all rows walk all trees at once, one level per step
        (``np.take`` on flat arrays); 7–9 times the leaf masks' CPU time at 1,000–5,000 rows of 200 trees."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        n = len(X)
        node = np.tile(np.asarray(self.roots, dtype=np.intp), (n, 1))
        base = (np.arange(n, dtype=np.intp) * X.shape[1])[:, None]
        flat = X.ravel()
        for _ in range(self._depth):
            right = flat.take(base + self._feature.take(node)) > self._threshold.take(node)
            node = self._kids.take(2 * node + right)
        return self.value.take(node).sum(axis=1)

    def predict(self, X: np.ndarray, keys: "np.ndarray | None" = None, owner: Any = None) -> np.ndarray:
        """Reuse probabilities for feature rows ``X`` of shape ``(n, len(features))``; shape ``(n,)``
        (``keys``, ``owner``: :meth:`score`)."""
        a, b = self.calibration
        z = a * self.score(X, keys, owner) + b
        return 1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))

    def to_dict(self) -> dict[str, Any]:
        """Thresholds are stored exactly (a rounded one could send a row the other way); leaf values
        and the calibration to :data:`DIGITS` significant digits."""
        def r(a: np.ndarray) -> list[float]:
            return [float(f"{x:.{DIGITS}g}") for x in a]
        return {"format": FORMAT, "version": VERSION, "kind": "trees", "features": list(self.features),
                "roots": [int(x) for x in self.roots], "feature": [int(x) for x in self.feature],
                "threshold": [float(x) for x in self.threshold], "left": [int(x) for x in self.left],
                "right": [int(x) for x in self.right], "value": r(self.value),
                "calibration": r(np.asarray(self.calibration)), "meta": self.meta}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")) + "\n")

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "model") -> "TreeReuseModel":
        """Raises:
            ReuseModelError: node arrays of different lengths, a child or root outside them, a split
                on a feature the model does not have.
        """
        try:
            nodes = {k: np.asarray(d[k], dtype=float if k in ("threshold", "value") else np.int64)
                     for k in ("feature", "threshold", "left", "right", "value")}
            roots = np.asarray(d["roots"], dtype=np.int64)
            a, b = (float(x) for x in d["calibration"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ReuseModelError(f"{source}: incomplete tree model ({exc})") from None
        n = len(nodes["feature"])
        split = nodes["feature"] >= 0
        if any(len(v) != n for v in nodes.values()) or not len(roots) or roots.min() < 0 or roots.max() >= n \
                or (nodes["feature"] >= len(FEATURES)).any() or np.isnan(nodes["threshold"][split]).any() or \
                (split & ((nodes["left"] < 0) | (nodes["left"] >= n) | (nodes["right"] < 0) | (nodes["right"] >= n))).any():
            raise ReuseModelError(f"{source}: inconsistent tree arrays (re-fit it with `historygraph fit`)")
        try:
            return cls(list(d["features"]), roots, nodes["feature"], nodes["threshold"], nodes["left"], nodes["right"],
                       nodes["value"], (a, b), dict(d.get("meta", {})))
        except ReuseModelError as exc:
            raise ReuseModelError(f"{source}: {exc}") from None


@dataclass
class BlendReuseModel:
    """A weighted mean of other models' reuse probabilities (module docstring); ``weights`` sum to 1.

    An ensemble of unlike models ("Ensemble Methods in Machine Learning", Dietterich, MCS 2000, §2):
    the logistic regression's smooth, monotone response and the trees' step functions err on
    different rows, and on rows unlike the training agent's (values beyond the trees' last
    threshold) the mean keeps the logistic regression's extrapolation for half of the probability.
    """

    features: list[str]
    models: list["ReuseModel | TreeReuseModel"]
    weights: list[float]
    meta: dict[str, Any] = field(default_factory=dict)

    def predict(self, X: np.ndarray, keys: "np.ndarray | None" = None, owner: Any = None) -> np.ndarray:
        """Reuse probabilities for feature rows ``X`` of shape ``(n, len(features))``; shape ``(n,)``
        (``keys``, ``owner``: :meth:`TreeReuseModel.score`, for the tree members)."""
        out = self.weights[0] * self.models[0].predict(X, keys, owner)
        for w, m in zip(self.weights[1:], self.models[1:]):
            out += w * m.predict(X, keys, owner)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "kind": "blend", "features": list(self.features),
                "weights": [float(f"{w:.{DIGITS}g}") for w in self.weights],
                "models": [m.to_dict() for m in self.models], "meta": self.meta}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")) + "\n")

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "model") -> "BlendReuseModel":
        """Raises:
            ReuseModelError: no models, weights of another length, negative or not summing to 1, a
                member that is itself a blend or unreadable.
        """
        parts, weights = d.get("models"), d.get("weights")
        if not isinstance(parts, list) or not parts or not isinstance(weights, list) or len(weights) != len(parts):
            raise ReuseModelError(f"{source}: a blend needs as many weights as models (re-fit it with `historygraph fit`)")
        try:
            w = [float(x) for x in weights]
        except (TypeError, ValueError) as exc:
            raise ReuseModelError(f"{source}: blend weights: {exc}") from None
        if min(w) < 0 or abs(sum(w) - 1.0) > 1e-6:
            raise ReuseModelError(f"{source}: blend weights must be ≥ 0 and sum to 1, not {w}")
        models = []
        for i, part in enumerate(parts):
            if not isinstance(part, dict) or part.get("kind") == "blend":
                raise ReuseModelError(f"{source}: member {i} of the blend must be a logistic or trees model")
            m = ReuseModel.from_dict(part, f"{source} (member {i})")
            assert not isinstance(m, BlendReuseModel)
            models.append(m)
        return cls(list(d["features"]), models, w, dict(d.get("meta", {})))


AnyReuseModel = ReuseModel | TreeReuseModel | BlendReuseModel


# de Bruijn multipliers: for a word with one bit set, (bit · M mod 2^L) >> shift is a distinct number
# in 0 … L−1 for each bit position ("Using de Bruijn Sequences to Index a 1 in a Computer Word",
# Leiserson, Prokop and Randall, 1998)
_DE_BRUIJN: dict[int, tuple[type[np.unsignedinteger], int, int]] = {
    16: (np.uint16, 0x09AF, 12), 32: (np.uint32, 0x077CB531, 27), 64: (np.uint64, 0x03F79D71B4CB0A89, 58)}
GROUP_CELLS = 4096  # most cells of one feature group's table (4096 × trees × 2 bytes; 6.3 MB for the 200-tree model)


@dataclass
class LeafMasks:
    """Every tree's exit leaf for many rows at once, with bitmasks (the exit-leaf rule of "QuickScorer:
    a Fast Algorithm to Rank Documents with Additive Ensembles of Regression Trees", Lucchese et al.,
    SIGIR 2015, §3), arranged for numpy.

    Number the leaves of each tree 0 … L−1 from left to right. A split node whose test fails
    (``x[feature] > threshold``: the row goes right) rules out every leaf of its left subtree; the
    exit leaf is the lowest leaf no failing node of its tree rules out, whichever nodes of the tree
    fail (QuickScorer's Theorem 1), so the tests can be taken in any order. Here they are taken per
    feature: with the distinct thresholds of feature ``f`` sorted, ``u_1 < … < u_m``, a row fails
    exactly the nodes of ``f`` whose threshold is among the ``k = #{u_i < x[f]}`` smallest (its bin),
    so the AND of their masks is one row of a table built once, ``(m + 1) × trees``. Features with
    few bins are joined into groups of at most :data:`GROUP_CELLS` cells (the product of their bins;
    the group's table holds the AND of its features' rows), so a row costs one table row per group,
    ANDed: 12 groups for the shipped 200-tree LambdaRank model. The lowest set bit of the result
    names the exit leaf (``m & −m``, then a de Bruijn multiplication to its position) and its value is
    read from a ``trees × L`` table. A NaN feature goes left at every node of it (bin 0), as
    ``x > threshold`` is false for it.

    Attributes:
        groups: per group, ``(features, thresholds per feature, cell stride per feature)``.
        table: the groups' tables stacked, shape ``(cells of all groups, trees)``, leaf masks.
        offsets: the first row of each group's table in ``table``.
        values: the leaf values, slot ``t·L + slot(leaf)`` for leaf ``leaf`` of tree ``t``.
        width: ``L``, bits per mask (16, 32 or 64).
    """

    groups: list[tuple[list[int], list[np.ndarray], list[int]]]
    table: np.ndarray
    offsets: np.ndarray
    values: np.ndarray
    width: int

    @classmethod
    def build(cls, model: "TreeReuseModel") -> "LeafMasks | None":
        """The tables of ``model``; ``None`` when a tree has more than 64 leaves.

        Raises:
            ReuseModelError: a node reached twice (a cycle, or a node shared by trees).
        """
        feat, thr, left, right = model.feature, model.threshold, model.left, model.right
        trees = len(model.roots)
        tree_of = np.full(len(feat), -1, dtype=np.intp)
        rank = np.zeros(len(feat), dtype=np.intp)  # leaf: its number in its tree, left to right
        below: dict[int, int] = {}  # node -> bits of the leaves under it
        for t, root in enumerate(model.roots):
            order, stack, leaves = [], [int(root)], 0
            while stack:
                v = stack.pop()
                if tree_of[v] >= 0:
                    raise ReuseModelError("tree model: a node reached twice (re-fit it with `historygraph fit`)")
                tree_of[v] = t
                order.append(v)
                if feat[v] < 0:
                    rank[v], leaves = leaves, leaves + 1
                else:
                    stack += [int(right[v]), int(left[v])]  # the left subtree first: leaves numbered left to right
            if leaves > 64:
                return None
            for v in reversed(order):  # children before their parent
                below[v] = 1 << int(rank[v]) if feat[v] < 0 else below[int(left[v])] | below[int(right[v])]
        leaf_counts = np.bincount(tree_of[(feat < 0) & (tree_of >= 0)], minlength=trees)
        width = next(w for w in sorted(_DE_BRUIJN) if leaf_counts.max() <= w)
        dtype, mult, shift = _DE_BRUIJN[width]
        ones = (1 << width) - 1
        slot = [((mult << k) & ones) >> shift for k in range(width)]
        leaf_nodes = np.flatnonzero((feat < 0) & (tree_of >= 0))
        values = np.zeros(trees * width)
        values[tree_of[leaf_nodes] * width + np.asarray(slot, dtype=np.intp)[rank[leaf_nodes]]] = model.value[leaf_nodes]

        split = (feat >= 0) & (tree_of >= 0)
        per_feature: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for f in np.unique(feat[split]).tolist():
            nodes = np.flatnonzero(split & (feat == f))
            u = np.unique(thr[nodes])
            rows = np.full((len(u) + 1, trees), ones, dtype=dtype)
            for v, r in zip(nodes.tolist(), np.searchsorted(u, thr[nodes]).tolist()):
                rows[r + 1:, tree_of[v]] &= dtype(ones & ~below[int(left[v])])  # bins above u_r fail the test
            per_feature[f] = (u, rows)
        groups: list[tuple[list[int], list[np.ndarray], list[int]]] = []
        tables: list[np.ndarray] = []
        offsets: list[int] = []
        cells = 0
        members: list[int] = []
        for f in sorted(per_feature, key=lambda f: (len(per_feature[f][0]), f)) + [-1]:
            bins = len(per_feature[f][0]) + 1 if f >= 0 else 0
            size = int(np.prod([len(per_feature[g][0]) + 1 for g in members]))
            if members and (f < 0 or size * bins > GROUP_CELLS):
                table = per_feature[members[0]][1]
                for g in members[1:]:
                    table = (table[:, None, :] & per_feature[g][1][None, :, :]).reshape(-1, trees)
                strides = [int(np.prod([len(per_feature[h][0]) + 1 for h in members[i + 1:]])) for i in range(len(members))]
                groups.append((members, [per_feature[g][0] for g in members], strides))
                tables.append(table)
                offsets.append(cells)
                cells += len(table)
                members = []
            if f >= 0:
                members.append(f)
        table = np.concatenate(tables) if tables else np.full((1, trees), ones, dtype=dtype)
        return cls(groups, np.ascontiguousarray(table), np.asarray(offsets or [0], dtype=np.intp), values, width)

    def __post_init__(self) -> None:
        #: per group, ``(first table row, [(feature, thresholds, its only threshold or None, cell stride)])``
        self._plan = [(offset, [(f, u, float(u[0]) if len(u) == 1 else None, stride)
                                for f, u, stride in zip(features, thresholds, strides)])
                      for (features, thresholds, strides), offset in zip(self.groups, self.offsets.tolist())]

    def cells(self, X: np.ndarray) -> np.ndarray:
        """The row of :attr:`table` each row of ``X`` (shape ``(n, features)``, float64) reads for each
        group: shape ``(n, groups)``, intp (a row's bins, so its exit leaves and score are functions of
        its cells alone)."""
        n = len(X)
        XT = np.ascontiguousarray(X.T)  # a feature's values contiguous (faster to search)
        nan = bool(np.isnan(XT).any())
        out = np.empty((len(self._plan), n), dtype=np.intp)
        for cell, (offset, features) in zip(out, self._plan):
            cell.fill(offset)
            for f, u, only, stride in features:
                x = XT[f]
                if only is not None:
                    k = x > only  # (NaN: False, left)
                else:
                    k = np.searchsorted(u, x)  # #{u_i < x}; NaN sorts last, and goes left
                    if nan:
                        k[np.isnan(x)] = 0
                cell += k * stride if stride != 1 else k
        return out.T

    def masks(self, cells: np.ndarray, groups: "list[int] | None" = None) -> np.ndarray:
        """The AND of the table rows ``cells`` (shape ``(n, groups)``, :meth:`cells`) names, over
        ``groups`` (column indices; every group by default): shape ``(n, trees)``, one leaf mask per
        tree (every leaf's bit set where no group is read)."""
        cols = list(range(cells.shape[1])) if groups is None else groups
        if not cols:
            return np.repeat(self.table[:1], len(cells), axis=0)
        acc = self.table.take(cells[:, cols[0]], axis=0)
        if len(cols) > 1:
            buf = np.empty_like(acc)
            for j in cols[1:]:
                np.bitwise_and(acc, self.table.take(cells[:, j], axis=0, out=buf), out=acc)
        return acc

    def exit_values(self, acc: np.ndarray) -> np.ndarray:
        """The value of each tree's exit leaf, the lowest set bit of each of the masks ``acc``
        (shape ``(n, trees)``, :meth:`masks`; overwritten): shape ``(n, trees)``."""
        dtype, mult, shift = _DE_BRUIJN[self.width]
        buf = np.empty_like(acc)
        np.negative(acc, out=buf)  # two's complement: acc & −acc keeps the lowest set bit
        acc &= buf
        acc *= dtype(mult)
        acc >>= dtype(shift)
        trees = acc.shape[1]
        if trees * self.width <= np.iinfo(dtype).max:  # the tree's first slot added in the narrow type (faster)
            acc += np.arange(trees, dtype=dtype) * dtype(self.width)
            return self.values.take(acc.astype(np.intp))
        index = acc.astype(np.intp)
        index += np.arange(trees, dtype=np.intp) * self.width
        return self.values.take(index)

    def leaf_values(self, X: np.ndarray) -> np.ndarray:
        """The value of the leaf each row of ``X`` (shape ``(n, features)``, float64) reaches in each
        tree, shape ``(n, trees)``."""
        return self.exit_values(self.masks(self.cells(X)))


class ScoreMemo:
    """The scores of one :class:`LeafMasks`'s rows kept by key across calls (a result's position:
    one memo per graph), so that a render scores again only the rows whose cells changed.

    A row's score is a function of its cells (:meth:`LeafMasks.cells`), so a key whose cells are
    those of its previous call keeps its score, the same bits. Between two renders most rows keep
    their cells in all groups but one (the latest message's word cover moves half of them); the
    memo also keeps each key's AND over every group but that ``open`` one, so that a row whose
    cells changed only there costs one table row and its exit leaves. ``open`` follows the group
    whose cells changed in most rows (a switch rebuilds every row once).

    Attributes:
        open: the group left out of ``rest`` (``None`` before the first call).
    """

    def __init__(self, masks: LeafMasks) -> None:
        self.masks = masks
        self.open: int | None = None
        groups, trees = len(masks.groups), masks.table.shape[1]
        self._cells = np.zeros((0, groups), dtype=np.intp)
        self._rest = np.zeros((0, trees), dtype=masks.table.dtype)  # per key: AND over every group but open
        self._score = np.zeros(0)
        self._known = np.zeros(0, dtype=bool)

    def _reserve(self, top: int) -> None:
        if top <= len(self._known):
            return
        size = max(top, 2 * len(self._known), 64)
        for name in ("_cells", "_rest", "_score", "_known"):
            old = getattr(self, name)
            new = np.zeros((size,) + old.shape[1:], dtype=old.dtype)
            new[:len(old)] = old
            setattr(self, name, new)

    def score(self, X: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """:meth:`TreeReuseModel.score` of the rows ``X`` (shape ``(n, features)``), row ``i`` kept
        under ``keys[i]`` (distinct integers ≥ 0, shape ``(n,)``); shape ``(n,)``, the same bits."""
        masks = self.masks
        cells = masks.cells(X)
        keys = np.asarray(keys, dtype=np.intp)
        groups = cells.shape[1]
        if not len(keys) or not groups:
            return masks.exit_values(masks.masks(cells)).sum(axis=1)
        self._reserve(int(keys.max()) + 1)
        known = self._known[keys]
        changed = self._cells[keys] != cells
        changed[~known] = True
        if self.open is None:
            self.open = groups - 1
        o = self.open
        rest = [j for j in range(groups) if j != o]
        redo = np.flatnonzero(changed[:, rest].any(axis=1)) if rest else np.zeros(0, np.intp)
        if len(redo):
            self._rest[keys[redo]] = masks.masks(cells[redo], rest)
        again = np.flatnonzero(changed.any(axis=1))
        if len(again):
            at = keys[again]
            acc = self._rest[at] if rest else np.repeat(masks.table[:1], len(at), axis=0)
            acc &= masks.table.take(cells[again, o], axis=0)
            self._score[at] = masks.exit_values(acc).sum(axis=1)
        self._cells[keys] = cells
        self._known[keys] = True
        moved = changed[known].sum(axis=0)  # rows whose cells changed, per group (keys kept from before)
        top = int(np.argmax(moved)) if len(moved) else o
        if top != o and moved[top] > 2 * moved[o] + 8:
            self.open = top
            self._known[:] = False  # rest is over another set of groups now: every key again
        return self._score[keys]
