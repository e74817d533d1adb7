"""Provider price models with their prompt caches, read from TOML (``prices.toml`` ships with the package).

A :class:`PriceModel` is one table of such a file: the prices of uncached input, cache reads,
cache writes, output and embedding tokens (USD per million tokens), and the rule of the provider's
prompt cache that :mod:`historygraph.eval.prompt_cache` simulates on a policy's requests
(``caching``, ``min_tokens``, ``step``, ``ttl_calls``, ``ttl_seconds``, ``max_breakpoints``, ``lookback_blocks``).
The shipped file cites, next to each rule, the provider documentation it comes from (OpenAI prompt
caching, Anthropic prompt caching, DeepSeek context caching) and keeps ContextRender eq. 3's
reference prices as the ``contextrender`` model. A user's file (``historygraph replay --prices
FILE``) adds tables to the shipped ones; a table of a shipped name replaces it.

:func:`load_price_models` checks every table and raises :class:`PriceModelError` naming the file,
the table, the key and what is expected.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Any

CACHING = ("automatic", "breakpoints")
RATES = ("input", "cached_input", "cache_write", "output", "embedding")
REQUIRED = ("caching", "input", "cached_input", "output", "ttl_calls")
BREAKPOINT_KEYS = ("max_breakpoints", "lookback_blocks")
EQ3_EMBEDDING = 0.13  # ContextRender eq. 3's embedding price, the default of ``embedding``


class PriceModelError(ValueError):
    """A price-model file that cannot be used; the message names the file, table and key."""


@dataclass(frozen=True)
class PriceModel:
    """One provider's prices (USD per million tokens) and prompt-cache rule (module docstring).

    ``cache_write`` defaults to ``input`` (automatic caches bill no write surcharge);
    ``max_breakpoints`` and ``lookback_blocks`` apply to ``caching = "breakpoints"`` only."""

    name: str
    caching: str
    input: float
    cached_input: float
    output: float
    ttl_calls: int
    cache_write: float | None = None
    embedding: float = EQ3_EMBEDDING
    min_tokens: int = 0
    step: int = 1
    max_breakpoints: int = 4
    lookback_blocks: int = 20
    ttl_seconds: float = 0.0
    description: str = ""

    @property
    def write_price(self) -> float:
        return self.input if self.cache_write is None else self.cache_write

    @property
    def rule(self) -> tuple:
        """What the simulation depends on (not the prices): two models with the same rule cache the
        same tokens, so a run's token counts can be repriced for the other (``report --prices``)."""
        return (self.caching, self.min_tokens, self.step, self.ttl_calls, self.max_breakpoints, self.lookback_blocks, self.ttl_seconds)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


SHIPPED = "prices.toml"


def shipped_path() -> Path:
    """The price-model file that ships in the package."""
    return Path(str(files("historygraph.eval") / SHIPPED))


def _number(where: str, key: str, value: Any, whole: bool = False, least: float = 0) -> float | int:
    ok = isinstance(value, int) if whole else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or value < least:
        kind = f"a whole number >= {least:g}" if whole else f"a number >= {least:g} (USD per million tokens)"
        raise PriceModelError(f"{where}: key {key!r}: expected {kind}, got {value!r}")
    return value


def parse_table(name: str, table: Any, source: str) -> PriceModel:
    """One TOML table as a :class:`PriceModel`, every key checked (module docstring)."""
    where = f"{source}: price model [{name}]"
    if not isinstance(table, dict):
        raise PriceModelError(f"{where}: expected a table of keys (caching, input, ...), got {table!r}")
    known = {f.name for f in fields(PriceModel)} - {"name"}
    for key in table:
        if key not in known:
            raise PriceModelError(f"{where}: unknown key {key!r}; known keys: {', '.join(sorted(known))}")
    for key in REQUIRED:
        if key not in table:
            raise PriceModelError(f"{where}: key {key!r} is missing (required: {', '.join(REQUIRED)})")
    if table["caching"] not in CACHING:
        raise PriceModelError(f"{where}: key 'caching': expected one of {', '.join(map(repr, CACHING))}, got {table['caching']!r}")
    if table["caching"] == "automatic":
        for key in BREAKPOINT_KEYS:
            if key in table:
                raise PriceModelError(f"{where}: key {key!r} applies to caching = \"breakpoints\" only")
    elif "step" in table:
        raise PriceModelError(f"{where}: key 'step' applies to caching = \"automatic\" only (a breakpoint caches whole prefixes)")
    values: dict[str, Any] = {"name": name, "caching": table["caching"]}
    for key in RATES + ("ttl_seconds",):
        if key in table:
            values[key] = float(_number(where, key, table[key]))
    for key, least in (("min_tokens", 0), ("step", 1), ("ttl_calls", 1), ("max_breakpoints", 2), ("lookback_blocks", 0)):
        if key in table:
            values[key] = _number(where, key, table[key], whole=True, least=least)
    if "max_breakpoints" in table and table["max_breakpoints"] > 4:
        raise PriceModelError(f"{where}: key 'max_breakpoints': expected 2 to 4 (a request carries at most 4), got {table['max_breakpoints']!r}")
    if "description" in table:
        if not isinstance(table["description"], str):
            raise PriceModelError(f"{where}: key 'description': expected a string, got {table['description']!r}")
        values["description"] = table["description"]
    return PriceModel(**values)


def read_price_file(path: Path) -> dict[str, PriceModel]:
    """Every table of the TOML file at ``path``, in file order.

    Raises:
        PriceModelError: unreadable file, invalid TOML, no table, or a table that fails :func:`parse_table`.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PriceModelError(f"{path}: cannot read the price-model file ({exc.strerror or exc})") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PriceModelError(f"{path}: not valid TOML ({exc})") from exc
    if not data:
        raise PriceModelError(f"{path}: no price model; write one table per model, e.g. [my-model] with keys {', '.join(REQUIRED)}")
    return {name: parse_table(name, table, str(path)) for name, table in data.items()}


def load_price_models(path: Path | None = None) -> dict[str, PriceModel]:
    """The shipped price models, with the tables of ``path`` (a user's file) added or replacing
    those of the same name."""
    models = read_price_file(shipped_path())
    if path is not None:
        models.update(read_price_file(path))
    return models


@lru_cache(maxsize=1)
def default_price_models() -> dict[str, PriceModel]:
    """The shipped price models (read once; treat as read-only)."""
    return load_price_models()


def select(models: dict[str, PriceModel], names: list[str]) -> dict[str, PriceModel]:
    """The models named (all when ``names`` is empty), in the order given.

    Raises:
        PriceModelError: a name that is not a loaded model.
    """
    for n in names:
        if n not in models:
            raise PriceModelError(f"unknown price model {n!r}; loaded: {', '.join(models)}")
    return {n: models[n] for n in names} if names else dict(models)


LABELS = {"contextrender": "CR-eq3"}  # the eq. 3 reference model, whose name alone reads like the policy


def label(name: str) -> str:
    """A price model's name as table headers and recommendations print it: ``CR-eq3`` for the shipped
    ``contextrender`` model (ContextRender eq. 3's reference prices; its name in prices.toml, replay.json
    and ``--price-model`` is unchanged), every other name as it is."""
    return LABELS.get(name, name)
