"""The reuse model of the learned selector: a small JSON file, read with numpy alone.

A model maps the render-time features of :mod:`historygraph.fit.features` to the probability that
a tool result is reused at the next invocation. Two kinds of file:

* ``"kind": "logistic"`` (:class:`ReuseModel`), a logistic regression over standardised features::

    {"format": "historygraph-reuse-model", "version": 1, "kind": "logistic",
     "features": [...], "mean": [...], "scale": [...], "coef": [...], "intercept": x,
     "meta": {...}}

  ``p = 1 / (1 + e^{−(b + Σ_k w_k (x_k − μ_k) / σ_k)})``.
* ``"kind": "trees"`` (:class:`TreeReuseModel`), an ensemble of regression trees (LightGBM's
  LambdaRank objective, ``historygraph fit --objective lambdarank``, :mod:`historygraph.fit.train`) with a logistic
  calibration of its score: ``p = 1 / (1 + e^{−(a·s + b)})``, ``s`` the sum over trees of the leaf
  each row reaches (a node sends ``x`` left when ``x[feature] ≤ threshold``)::

    {"format": "historygraph-reuse-model", "version": 1, "kind": "trees", "features": [...],
     "roots": [...], "feature": [...], "threshold": [...], "left": [...], "right": [...],
     "value": [...], "calibration": [a, b], "meta": {...}}

  Nodes of every tree are numbered in one sequence; a leaf has ``feature`` −1 and its ``value``.

``meta`` records what it was fitted on and how (trajectories, rows, the command). Fitting needs
scikit-learn, and LightGBM for trees (:mod:`historygraph.fit.train`); loading and predicting need
numpy alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .features import FEATURES

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

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Reuse probabilities for feature rows ``X`` of shape ``(n, len(features))``; shape ``(n,)``."""
        z = ((X - self.mean) / self.scale) @ self.coef + self.intercept
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
    def from_dict(cls, d: dict[str, Any], source: str = "model") -> "ReuseModel | TreeReuseModel":
        """The model a file's contents describe (either kind of the module docstring).

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
        arr = {k: np.asarray(d[k], dtype=float) for k in ("mean", "scale", "coef")}
        if any(a.shape != (len(FEATURES),) for a in arr.values()):
            raise ReuseModelError(f"{source}: mean/scale/coef must each have {len(FEATURES)} entries")
        return cls(list(d["features"]), arr["mean"], arr["scale"], arr["coef"], float(d["intercept"]), dict(d.get("meta", {})))

    @classmethod
    def load(cls, path: str | Path | None = None) -> "ReuseModel | TreeReuseModel":
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


KINDS = ("logistic", "trees")


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

    def _max_depth(self) -> int:
        depth, level = 0, np.asarray(self.roots, dtype=np.intp)
        while len(level := level[self.feature[level] >= 0]):
            level = np.concatenate([self.left[level], self.right[level]]).astype(np.intp)
            depth += 1
        return depth

    def score(self, X: np.ndarray) -> np.ndarray:
        """The ensemble's raw score for feature rows ``X`` of shape ``(n, len(features))``; shape ``(n,)``.
        All rows walk all trees at once, one level per step (``np.take`` on flat arrays)."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        n = len(X)
        node = np.tile(np.asarray(self.roots, dtype=np.intp), (n, 1))
        base = (np.arange(n, dtype=np.intp) * X.shape[1])[:, None]
        flat = X.ravel()
        for _ in range(self._depth):
            right = flat.take(base + self._feature.take(node)) > self._threshold.take(node)
            node = self._kids.take(2 * node + right)
        return self.value.take(node).sum(axis=1)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Reuse probabilities for feature rows ``X`` of shape ``(n, len(features))``; shape ``(n,)``."""
        a, b = self.calibration
        z = a * self.score(X) + b
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
                or (nodes["feature"] >= len(FEATURES)).any() or \
                (split & ((nodes["left"] < 0) | (nodes["left"] >= n) | (nodes["right"] < 0) | (nodes["right"] >= n))).any():
            raise ReuseModelError(f"{source}: inconsistent tree arrays (re-fit it with `historygraph fit`)")
        return cls(list(d["features"]), roots, nodes["feature"], nodes["threshold"], nodes["left"], nodes["right"],
                   nodes["value"], (a, b), dict(d.get("meta", {})))
