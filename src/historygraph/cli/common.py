"""What the commands share: the consoles, error and warning lines, the options several commands
take (policy parameters, session, budget) and their checks, reading trace folders, opening a store."""

from __future__ import annotations

import difflib
import os
import re
from importlib.resources import files
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer
import typer.core
import typer.rich_utils
from rich.console import Console

from historygraph.history.events import Trace
from historygraph.policies import REGISTRY, PolicyError
from historygraph.policies import params as policy_params
from historygraph.store import StoreError, open_store
from historygraph.traces import TraceFormatError, list_trace_files, read_traces
from historygraph.traces._common import NO_RESULT


def _piped_width() -> int:
    """Width of piped output: a whole $COLUMNS ≥ 40 the user set, else 170 columns (read once, at start)."""
    try:
        return max(40, int(os.environ["COLUMNS"]))
    except (KeyError, ValueError):
        return 170


console = Console(width=None if Console().is_terminal else _piped_width())
if not Console().is_terminal and "COLUMNS" not in os.environ and typer.rich_utils.MAX_WIDTH is None:
    typer.rich_utils.MAX_WIDTH = 120  # --help piped or logged: rich's 80 columns cut option help to a few words
err = Console(stderr=True)

EXAMPLE = "dinner_bill.json"


class _BareFlags:
    """Help that shows a boolean flag as a flag: no ``<bool>`` type after it (typer's rich help
    prints one for every option, which read as if ``--json true`` were the syntax, an error)."""

    def get_params(self, ctx):  # noqa: ANN001, ANN201 - click's signature
        params = super().get_params(ctx)
        for p in params:
            if getattr(p, "is_flag", False) and p.metavar is None:
                p.metavar = ""  # (the rich help prints the metavar in place of the type when one is set)
        return params


class Command(_BareFlags, typer.core.TyperCommand):
    """Every ``historygraph`` command: typer's, with boolean flags shown bare (:class:`_BareFlags`)."""


class Group(_BareFlags, typer.core.TyperGroup):
    """The ``historygraph`` group: typer's, with boolean flags shown bare (:class:`_BareFlags`)."""


def example_trace_path() -> Path:
    """The small example trace shipped with the package (the dinner-bill scenario of ContextRender §2)."""
    return Path(str(files("historygraph") / "examples" / EXAMPLE))


def unknown_policy(name: str) -> None:
    close = difflib.get_close_matches(name, list(REGISTRY), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    fail(f"unknown policy {name!r}; {hint}run 'historygraph policies' to list them")


ParamOption = Annotated[list[str], typer.Option(
    "--param", "-P", help="Policy parameter name=value, or policy.name=value for one policy (repeatable; "
                          "'historygraph policies' lists them). Overrides --params.")]
ParamsFileOption = Annotated[Optional[Path], typer.Option(
    "--params", help="TOML file of policy parameters, one \\[policy-name] table per policy.")]
SessionArgument = Annotated[str, typer.Argument(help="Session id, or a replayed trace's whole id (the part of the session id "
                                                      "after its last ':') when one session has it ('historygraph sessions' "
                                                      "lists them).")]


def load_policy_params(items: list[str], path: Path | None, names: list[str]) -> dict[str, dict]:
    """Parameters per policy from ``--params`` then ``-P`` (exits naming the field on an error)."""
    try:
        out = policy_params.load_file(path) if path is not None else {}
        for name, values in policy_params.parse_cli(items, names).items():
            out[name] = {**out.get(name, {}), **values}
    except PolicyError as exc:
        fail(str(exc))
    return out


def plural(n: int, one: str, many: str | None = None) -> str:
    """``n`` and the noun that goes with it: ``plural(1, "token")`` is "1 token", ``plural(2, "tool
    result")`` "2 tool results" (``many``: an irregular plural)."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


SHOWN_IDS = 5  # ids a line lists before "… and N more"


def few(ids: list[str], shown: int = SHOWN_IDS) -> str:
    """``ids`` space-separated, the first ``shown`` of a longer list followed by "… and N more"."""
    if len(ids) <= shown:
        return " ".join(ids)
    return " ".join(ids[:shown]) + f" … and {len(ids) - shown} more"


def fail(msg: str, code: int = 2) -> NoReturn:
    err.print("[bold red]error:[/] ", end="")
    err.print(msg, markup=False, highlight=False, soft_wrap=True)  # paths and ids stay whole, copyable
    raise typer.Exit(code)


def warn(msg: str) -> None:
    err.print("[yellow]warning:[/] ", end="")
    err.print(msg, markup=False, highlight=False, soft_wrap=True)


def read_all(paths: list[Path], fmt: str | None, strict: bool) -> tuple[list, list[dict[str, str]]]:
    """Every readable trace under ``paths`` and the files skipped (``{"path", "error"}``, and
    ``"line"`` where a JSON Lines file's other lines were read), each named in a warning; with
    ``strict`` the first unreadable file ends the command."""
    traces: list[Trace] = []
    skipped: list[dict[str, str]] = []
    for p in paths:
        for f in list_trace_files(p):
            try:
                traces.extend(read_traces(f, format=fmt))
            except (TraceFormatError, OSError, UnicodeDecodeError) as exc:
                why = exc.what if isinstance(exc, TraceFormatError) else f"{type(exc).__name__}: {exc}"
                if strict:
                    fail(f"{exc if isinstance(exc, TraceFormatError) else f'{f}: {why}'} (--strict stops at the "
                         "first unreadable file)")
                field = exc.field if isinstance(exc, TraceFormatError) else None
                where = "" if field is None else f" {field}" if field.startswith("(") else f" (field {field})"
                entry = {"path": str(f), "error": f"{why}{where}"}
                if field is not None and field.startswith("line "):  # JSON Lines: the readable lines were kept
                    entry["line"] = field.split(".")[0]
                    warn(f"skipped {entry['line']} of {f}{where if '.' in field else ''}: {why}")
                else:
                    warn(f"skipped {f}{where}: {why}")
                skipped.append(entry)
    for key, what in REPAIRS.items():
        repaired = [t for t in traces if t.meta.get(key)]
        if repaired:
            names = sorted({Path(t.path).name for t in repaired})
            warn(f"read with a repair: {sum(int(t.meta[key]) for t in repaired)} {what} (in {len(repaired)} trace(s) "
                 f"of {', '.join(names[:3])}{', …' if len(names) > 3 else ''}; docs/robustness.md)")
    return traces, skipped


# the trace readers' repairs counted in Trace.meta (historygraph.traces), as said when read
REPAIRS = {"orphan_results": "tool result(s) without a recorded call kept as user messages",
           "synthetic_results": f"tool call(s) without a recorded result answered by '{NO_RESULT}'",
           "renamed_call_ids": "repeated tool call id(s) renamed id#2, id#3, …"}


def parse_budgets(text: str, hint: str = " (give one, or a comma-separated list)") -> list[int]:
    """``6000`` or ``2000,3000,6000``: distinct whole numbers >= 1, in the order given; ``32k``
    (as the tables write budgets) is 32,000."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if re.fullmatch(r"\d+[kK]", part):
            part = str(int(part[:-1]) * 1000)
        if not part.isdigit() or int(part) < 1:
            if re.fullmatch(r"\d{1,3}(,\d{3})+", text.strip()):
                fail(f"--budget {text!r}: write {text.strip().replace(',', '')} without a thousands separator "
                     "(a comma separates budgets, e.g. 2000,6000)")
            fail(f"--budget {text!r}: {part!r} is not a whole number of tokens >= 1{hint}")
        if int(part) not in out:
            out.append(int(part))
    return out


def one_budget(text: str) -> int:
    """``--budget`` of a command that takes one budget, checked as replay checks its list."""
    budgets = parse_budgets(text, hint="")
    if len(budgets) > 1:
        fail(f"--budget {text!r}: give one budget here (replay sweeps a comma-separated list)")
    return budgets[0]


def existing_store(store: str | None):  # noqa: ANN202
    """Open a store for reading; a SQLite file that does not exist is an error, not a new empty store."""
    try:
        return open_store(store, must_exist=True)
    except StoreError as exc:
        fail(f"{exc}: pass the --store you replayed or served with (nothing was created)")
    except Exception as exc:  # a corrupt database file, an unreachable server
        fail(f"cannot open store {store or 'default'}: {exc}")


def store_name(db) -> str:  # noqa: ANN001
    return str(getattr(db, "path", ":memory:"))

