"""The single registry of policy names: :func:`register` (a class decorator), :func:`create`,
:func:`names`, the specs, and the plugins of installed packages (entry point group
``historygraph.policies``).

Each policy class declares a typed ``Config`` dataclass whose defaults come from its paper;
:func:`create` builds one from keyword overrides, checks each value against the field's annotated
type (:mod:`historygraph.policies.config_types`) and rejects unknown fields by name.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any, Callable, cast

from historygraph.policies.base import Policy, PolicyError
from historygraph.policies.config_types import check


@dataclass(frozen=True)
class PolicySpec:
    name: str
    cls: type
    source: str
    summary: str
    defaults: dict[str, Any]
    replay_only: bool = False  # reads the recorded future (clairvoyant bounds): the evaluator only


REGISTRY: dict[str, PolicySpec] = {}
# The policy the library, the proxy and `historygraph render` use when none is named: `learned`, the
# highest Later-Used Result Recall (ContextRender B.4) on every source of the shared real traces at
# B = 6000 and 3000 with no more history tokens than ContextRender, and no embedding model to load
# (docs/learned.md). Name "contextrender" for the published ContextRender.
DEFAULT_POLICY = "learned"


def register(name: str, source: str, summary: str, replay_only: bool = False, **defaults: Any) -> Callable[[type], type]:
    """Class decorator: register ``cls`` under ``name``; ``defaults`` override its Config defaults
    (used for named variants such as the B.3 ablations). ``replay_only`` marks a policy that reads
    the recorded future (a clairvoyant bound): :func:`create` builds it only for the evaluator."""

    def deco(cls: type) -> type:
        if name in REGISTRY:
            raise PolicyError(f"policy name {name!r} registered twice")
        REGISTRY[name] = PolicySpec(name, cls, source, summary, defaults, replay_only)
        return cls

    return deco


def names(replay: bool = False) -> list[str]:
    """Registered policy names, sorted; the replay-only ones (clairvoyant bounds) only with ``replay``."""
    return sorted(n for n, spec in REGISTRY.items() if replay or not spec.replay_only)


def config_fields(name: str) -> dict[str, Any]:
    """The effective configuration of a registered policy: field -> default value."""
    spec = get_spec(name)
    cfg = getattr(spec.cls, "Config", None)
    out = {f.name: f.default for f in dataclasses.fields(cfg)} if cfg else {}
    out.update(spec.defaults)
    return out


def config_class(name: str) -> type | None:
    """The ``Config`` dataclass of the registered policy ``name`` (``None``: it takes no parameters).

    Raises:
        PolicyError: unknown policy.
    """
    return getattr(get_spec(name).cls, "Config", None)


def get_spec(name: str, replay: bool = True) -> PolicySpec:
    """The registered spec of ``name``. Raises ``PolicyError`` for an unknown name, naming the
    closest known ones (``difflib``'s ratio ≥ 0.6, as the CLI does) and listing all of them (without
    the replay-only ones unless ``replay``)."""
    try:
        return REGISTRY[name]
    except KeyError:
        known = names(replay)
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise PolicyError(f"unknown policy {name!r}; {hint}known: {', '.join(known)}") from None


def check_production(name: str) -> PolicySpec:
    """The spec of ``name`` if the library and the proxy may run it.

    Raises:
        PolicyError: unknown policy, or a replay-only policy (it reads the recorded future).
    """
    spec = get_spec(name, replay=False)
    if spec.replay_only:
        raise PolicyError(f"policy {name!r} reads the recorded future (a clairvoyant bound for the evaluator): "
                          f"it can only run in `historygraph replay`; choose a production policy such as 'learned' "
                          f"or 'contextrender'")
    return spec


def create(name: str, *, replay: bool = False, **overrides: Any) -> Policy:
    """Instantiate the policy ``name`` with its defaults plus ``overrides``. ``replay=True`` is
    passed only by the evaluator, which can show a policy the recorded future.

    Raises:
        PolicyError: unknown policy, unknown config field, a value of the wrong type (names the
            field and the expected type), a value the policy's ``Config`` refuses (its message), or
            a replay-only policy (``oracle``, ``oracle-omit``) asked for outside replay.
    """
    spec = check_production(name) if not replay else get_spec(name)
    cfg_cls = getattr(spec.cls, "Config", None)
    if cfg_cls is None:
        if overrides:
            raise PolicyError(f"policy {name!r} takes no parameters, got {', '.join(overrides)}")
        return cast(Policy, spec.cls(name=name))
    known = {f.name for f in dataclasses.fields(cfg_cls)}
    unknown = set(overrides) - known
    if unknown:
        raise PolicyError(f"policy {name!r} has no parameter(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    params = {**spec.defaults, **check(name, cfg_cls, overrides)}
    try:
        config = cfg_cls(**params)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"policy {name!r}: {exc}") from None
    return cast(Policy, spec.cls(name=name, config=config))


ENTRY_POINT_GROUP = "historygraph.policies"


def load_plugins(group: str = ENTRY_POINT_GROUP) -> list[str]:
    """Register the policies that installed packages declare under the entry point ``group``.

    An entry point names a module or a class (``name = "package.module:Class"``). Loading it runs
    its :func:`register` decorators; a loaded class that registered nothing is registered under
    the entry point's name (``source``/``summary`` from its ``source`` attribute and docstring).
    A plugin that fails to load, or reuses a registered name, is skipped with a warning naming it:
    one broken package never stops the others. Returns the names added.
    """
    import warnings
    from importlib.metadata import entry_points

    added: list[str] = []
    for ep in entry_points(group=group):
        before = set(REGISTRY)
        try:
            obj = ep.load()
            if isinstance(obj, type) and ep.name not in REGISTRY and set(REGISTRY) == before:
                doc = (obj.__doc__ or "").strip().splitlines()
                register(ep.name, str(getattr(obj, "source", f"plugin {ep.value}")), doc[0] if doc else "")(obj)
        except Exception as exc:  # any failure of a third-party package is reported, not raised
            for n in set(REGISTRY) - before:
                del REGISTRY[n]
            warnings.warn(f"historygraph policy plugin {ep.name!r} ({ep.value}) not loaded: {type(exc).__name__}: {exc}",
                          RuntimeWarning, stacklevel=2)
            continue
        added += sorted(set(REGISTRY) - before)
    return added
