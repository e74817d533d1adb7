"""The ``historygraph`` command: replay traces through policies, list policies, inspect the store, serve the proxy.

One module per command group: :mod:`~historygraph.cli.replay` (replay, report),
:mod:`~historygraph.cli.policies`, :mod:`~historygraph.cli.sessions` (sessions, show, render),
:mod:`~historygraph.cli.serve` (serve, mcp) and :mod:`~historygraph.cli.fit`; what they share is in
:mod:`~historygraph.cli.common` and :mod:`~historygraph.cli.progress`. This module builds the typer
``app`` (the ``historygraph`` console script) and registers the commands in the order ``--help``
lists them."""

from __future__ import annotations

import inspect
from typing import Annotated

import typer

from historygraph import __version__
from historygraph.cli import fit, policies, replay, serve, sessions
from historygraph.cli.common import Command, Group, console

app = typer.Typer(cls=Group, help="historygraph: render agent histories under a token budget, chosen by evidence.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]})
app.command(cls=Command)(replay.replay)
app.command(cls=Command)(replay.report)
app.command(cls=Command)(policies.policies)
app.command(cls=Command)(sessions.sessions)
app.command(cls=Command)(sessions.show)
app.command(cls=Command)(sessions.render)
app.command(cls=Command)(serve.serve)
app.command(cls=Command)(fit.fit)
app.command("mcp", cls=Command)(serve.mcp_command)


def _version(value: bool) -> None:
    if value:
        console.print(__version__)
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """historygraph: render agent histories under a token budget, chosen by evidence."""


def _flowed(doc: str) -> str:
    """A command's docstring as help text: the lines of each paragraph joined (typer's rich help keeps
    a docstring's line breaks, which the source wraps at its own width, so sentences broke mid-way)."""
    return "\n\n".join(" ".join(line.strip() for line in para.splitlines()) for para in inspect.cleandoc(doc).split("\n\n"))


for _info in app.registered_commands:
    if _info.help is None and _info.callback is not None and _info.callback.__doc__:
        _info.help = _flowed(_info.callback.__doc__)
