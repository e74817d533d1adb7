"""The reuse model of the learned selector: a small JSON file, read with numpy alone.

A model maps the render-time features of :mod:`historygraph.fit.features` to the probability that
a tool result is reused at the next invocation. The file holds a logistic regression over
standardised features::

    {"format": "historygraph-reuse-model", "version": 1, "kind": "logistic",
     "features": [...], "mean": [...], "scale": [...], "coef": [...], "intercept": x,
     "meta": {...}}

``p = 1 / (1 + e^{−(b + Σ_k w_k (x_k − μ_k) / σ_k)})``. ``meta`` records what it was fitted on and
how (trajectories, rows, the command). Fitting needs scikit-learn (:mod:`historygraph.fit.train`);
loading and predicting do not.
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
    def from_dict(cls, d: dict[str, Any], source: str = "model") -> "ReuseModel":
        if d.get("format") != FORMAT:
            raise ReuseModelError(f"{source}: not a historygraph reuse model (format {d.get('format')!r}, expected {FORMAT!r})")
        if d.get("version") != VERSION or d.get("kind") != "logistic":
            raise ReuseModelError(f"{source}: unsupported model version {d.get('version')!r} / kind {d.get('kind')!r} "
                             f"(this historygraph reads version {VERSION}, kind 'logistic'); re-fit it with `historygraph fit`")
        if list(d.get("features", ())) != list(FEATURES):
            missing = sorted(set(FEATURES) - set(d.get("features", ())))
            raise ReuseModelError(f"{source}: its features differ from this version's ({', '.join(missing) or 'order'}); "
                             f"re-fit it with `historygraph fit`")
        arr = {k: np.asarray(d[k], dtype=float) for k in ("mean", "scale", "coef")}
        if any(a.shape != (len(FEATURES),) for a in arr.values()):
            raise ReuseModelError(f"{source}: mean/scale/coef must each have {len(FEATURES)} entries")
        return cls(list(d["features"]), arr["mean"], arr["scale"], arr["coef"], float(d["intercept"]), dict(d.get("meta", {})))

    @classmethod
    def load(cls, path: str | Path | None = None) -> "ReuseModel":
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
