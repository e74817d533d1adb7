"""Policy parameters from code, the command line and TOML files, checked against each policy's
``Config`` dataclass.

* :func:`check` verifies every value against the field's annotated type (``int``, ``float``
  (an ``int`` is accepted), ``bool``, ``str``, ``X | None``, ``Literal[...]``, ``tuple[X, ...]``)
  and raises :class:`~historygraph.policies.base.PolicyError` naming the policy, the field, the
  expected type and what was given;
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

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from historygraph.policies.base import PolicyError, config_fields, get_spec


def field_types(name: str) -> dict[str, Any]:
    """``field -> annotated type`` of the registered policy ``name`` (empty: no parameters)."""
    cfg = getattr(get_spec(name).cls, "Config", None)
    if cfg is None:
        return {}
    hints = typing.get_type_hints(cfg)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cfg)}


def type_name(tp: Any) -> str:
    if tp is Any:
        return "any value"
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in get_args(tp))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin is tuple:
        return f"a list of {type_name(get_args(tp)[0])}" if get_args(tp) else "a list"
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def matches(value: Any, tp: Any) -> bool:
    """Whether ``value`` is of the annotated type ``tp`` (see the module docstring)."""
    if tp is Any:
        return True
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return any(matches(value, a) for a in get_args(tp))
    if origin is Literal:
        return value in get_args(tp)
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(value, (tuple, list)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(matches(v, args[0]) for v in value)
        return len(args) == len(value) and all(matches(v, a) for v, a in zip(value, args))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp) if isinstance(tp, type) else True


def check(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with tuple fields given as lists converted to tuples, after checking each value.

    Raises:
        PolicyError: unknown policy or field, or a value of the wrong type (names all three).
    """
    types_ = field_types(name)
    out = {}
    for key, value in params.items():
        if key not in types_:
            known = ", ".join(sorted(types_)) or "none"
            raise PolicyError(f"policy {name!r} has no parameter {key!r}; known: {known}")
        tp = types_[key]
        if not matches(value, tp):
            raise PolicyError(f"policy {name!r} parameter {key!r}: expected {type_name(tp)}, "
                              f"got {type(value).__name__} {value!r}")
        out[key] = tuple(value) if isinstance(value, list) else value
    return out


_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


def convert(name: str, key: str, text: str) -> Any:
    """The command-line text ``text`` of parameter ``key`` of policy ``name`` as the field's type.

    Raises:
        PolicyError: unknown field, or text that is not of the field's type.
    """
    types_ = field_types(name)
    if key not in types_:
        known = ", ".join(sorted(types_)) or "none"
        raise PolicyError(f"policy {name!r} has no parameter {key!r}; known: {known}")
    tp = types_[key]
    for candidate in _candidates(text, tp):
        if matches(candidate, tp):
            return candidate
    raise PolicyError(f"policy {name!r} parameter {key!r}: expected {type_name(tp)}, got {text!r}")


def _candidates(text: str, tp: Any) -> list[Any]:
    out: list[Any] = []
    low = text.strip().lower()
    if low in ("none", "null"):
        out.append(None)
    if low in _TRUE:
        out.append(True)
    if low in _FALSE:
        out.append(False)
    for conv in (int, float):
        try:
            out.append(conv(text))
        except ValueError:
            pass
    if get_origin(tp) is tuple:
        items = [t.strip() for t in text.split(",") if t.strip()]
        inner = get_args(tp)[0] if get_args(tp) else Any
        out.append(tuple(next((c for c in _candidates(t, inner) if matches(c, inner)), t) for t in items))
    out.append(text)
    return out


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
            out[target][field] = convert(target, field, text)
            continue
        if dot:
            from historygraph.policies.base import REGISTRY

            what = "is not one of the chosen policies" if target in REGISTRY else "is not a registered policy"
            raise PolicyError(f"-P {item!r}: {target!r} {what} ({', '.join(policies)})")
        having = [p for p in policies if key in config_fields(p)]
        if not having:
            raise PolicyError(f"-P {item!r}: none of the chosen policies ({', '.join(policies)}) has a parameter {key!r}")
        for p in having:
            out[p][key] = convert(p, key, text)
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
            out[name] = check(name, table)
        except PolicyError as exc:
            raise PolicyError(f"{p}: {exc}") from None
    return out
