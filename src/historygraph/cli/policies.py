"""``historygraph policies``: the registered policies with their parameters and paper sources."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from historygraph.cli.common import console
from historygraph.policies import DEFAULT_POLICY, REGISTRY, config_fields


def policies(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """List the registered policies with their parameters and paper sources."""
    rows: list[dict[str, Any]] = [{"name": n, "source": s.source, "summary": s.summary, "parameters": config_fields(n)}
            for n, s in sorted(REGISTRY.items())]
    if as_json:
        console.print_json(json.dumps(rows))
        return
    default = f"{DEFAULT_POLICY}-stable"
    t = Table(title="Policies", header_style="bold", show_lines=True,
              caption=f"{default}: the default of the proxy, the library and a stored session ({DEFAULT_POLICY} at each "
                      "re-selection, only appending in between: docs/evaluator.md)")
    for c in ("name", "source", "what it does", "parameters (defaults)"):
        t.add_column(c)
    for r in rows:
        name = f"{r['name']}\n(default)" if r["name"] == default else r["name"]
        t.add_row(name, r["source"], r["summary"], ", ".join(f"{k}={v}" for k, v in r["parameters"].items()) or "–")
    console.print(t)

