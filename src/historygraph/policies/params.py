"""Policy parameters from the command line and TOML files, each value checked against the
policy's ``Config`` dataclass (:mod:`historygraph.policies.config_types`):

* :func:`parse_cli` reads ``-P name=value`` / ``-P policy.name=value`` items, converting each text
  to the field's type;
* :func:`load_file` reads a TOML file with one table per policy::

      [contextrender]
      w_rec = 0.5
      lam = 1.0

      [cw-sliding-window]
      n = 3
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from historygraph.policies.base import PolicyError
from historygraph.policies.config_types import check, convert
from historygraph.policies.registry import REGISTRY, config_class, config_fields


def parse_cli(items: list[str], policies: list[str]) -> dict[str, dict[str, Any]]:
    """``-P`` items → ``policy -> {field: value}`` for the chosen ``policies``.

    ``policy.field=value`` sets one policy's field; ``field=value`` sets it on every chosen policy
    that has the field (at least one must).

    Raises:
        PolicyError: an item without ``=``, an unknown policy or field, a value of the wrong type.
    """
    out: dict[str, dict[str, Any]] = {p: {} for p in policies}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise PolicyError(f"-P {item!r}: expected name=value or policy.name=value")
        key = key.strip()
        target, dot, field = key.rpartition(".")
        if dot and target in out:
            out[target][field] = convert(target, config_class(target), field, text)
            continue
        if dot:
            what = "is not one of the chosen policies" if target in REGISTRY else "is not a registered policy"
            raise PolicyError(f"-P {item!r}: {target!r} {what} ({', '.join(policies)})")
        having = [p for p in policies if key in config_fields(p)]
        if not having:
            raise PolicyError(f"-P {item!r}: none of the chosen policies ({', '.join(policies)}) has a parameter {key!r}")
        for p in having:
            out[p][key] = convert(p, config_class(p), key, text)
    return {p: v for p, v in out.items() if v}


def load_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """A TOML file of ``[policy]`` tables → ``policy -> {field: value}``, each checked.

    Raises:
        PolicyError: unreadable or invalid TOML (with the line), a top-level value outside a
            table, an unknown policy or field, a value of the wrong type.
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PolicyError(f"{p}: cannot read the parameter file: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{p}: not valid TOML: {exc}") from None
    out: dict[str, dict[str, Any]] = {}
    for name, table in data.items():
        if not isinstance(table, dict):
            raise PolicyError(f"{p}: {name!r} must be a [table] of one policy's parameters, got {type(table).__name__}")
        try:
            out[name] = check(name, config_class(name), table)
        except PolicyError as exc:
            raise PolicyError(f"{p}: {exc}") from None
    return out
