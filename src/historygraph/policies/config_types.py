"""Policy parameter values checked against the annotated types of a policy's ``Config`` dataclass.

:func:`check` verifies every value against the field's annotated type (``int``, ``float`` (an
``int`` is accepted), ``bool``, ``str``, ``X | None``, ``Literal[...]``, ``tuple[X, ...]``) and
raises :class:`~historygraph.policies.base.PolicyError` naming the policy, the field, the expected
type and what was given; :func:`convert` reads one command-line text as the field's type.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

from historygraph.policies.base import PolicyError


def field_types(cfg: type | None) -> dict[str, Any]:
    """``field -> annotated type`` of a policy's ``Config`` dataclass (empty: ``None``, no parameters)."""
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


def check(name: str, cfg: type | None, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with tuple fields given as lists converted to tuples, after checking each value
    against the fields of ``cfg`` (the ``Config`` dataclass of the policy ``name``).

    Raises:
        PolicyError: unknown field, or a value of the wrong type (names the policy, the field,
            the expected type and what was given).
    """
    types_ = field_types(cfg)
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


def convert(name: str, cfg: type | None, key: str, text: str) -> Any:
    """The command-line text ``text`` of parameter ``key`` of policy ``name`` (``Config`` dataclass
    ``cfg``) as the field's type.

    Raises:
        PolicyError: unknown field, or text that is not of the field's type.
    """
    types_ = field_types(cfg)
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
