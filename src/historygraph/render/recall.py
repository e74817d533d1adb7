"""The recall tool: how a model fetches what a rendering left out, by the reference its stand-in
names (:data:`~historygraph.render.markers.PLACEHOLDER` names a tool call id,
:data:`~historygraph.render.markers.DROPPED_MARK` a message span ``#A–#B``).

One definition and one lookup, shared by the proxy's tool (``historygraph serve --recall``,
:mod:`historygraph.server.recall_tool`), ``historygraph mcp`` and the framework adapters
(:mod:`historygraph.integrations`): the tool's name, description and JSON-schema parameters
(``{"ids": [...]}``) and :func:`recall_text`, the answer to one call. No framework or server
package is imported here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from historygraph.history.graph import MESSAGE_SPAN, ContextGraph
from historygraph.signals.tokens import TokenCounter

if TYPE_CHECKING:
    from historygraph.store import Store

TOOL_NAME = "historygraph_recall"
DESCRIPTION = ("Fetch the complete text of earlier tool results that this conversation shows only as a "
               "placeholder ('[tool result ID omitted from this context ...]'), or of the messages an "
               "'[omitted: messages #A–#B, ...]' marker stands for. Pass the result ids, or '#A–#B'.")
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"ids": {"type": "array", "items": {"type": "string"},
                           "description": "tool result ids named by placeholders, or message spans '#A–#B' named by markers"}},
    "required": ["ids"],
    "additionalProperties": False,
}
#: Tokens of one recalled result or span shown at most (longer ones are cut, marked); the default
#: of ``historygraph serve --recall-max-tokens`` and of the adapters' recall tools. Our choice: a
#: few screens of a file, well under any current model's context window.
MAX_TOKENS = 8000
#: The answer to a call whose arguments are not ``{"ids": [str, ...]}``.
USAGE = f'[{TOOL_NAME}: pass {{"ids": ["<tool result id>", ...]}} with the ids the placeholders name]'


def openai_tool() -> dict[str, Any]:
    """The tool as a Chat Completions ``tools`` entry (``{"type": "function", "function": {...}}``)."""
    return {"type": "function", "function": {"name": TOOL_NAME, "description": DESCRIPTION, "parameters": PARAMETERS}}


def ids_of(arguments: str | Mapping[str, Any] | None) -> list[str] | None:
    """The ids of one call's arguments (a JSON object text or a parsed object): ``ids`` as a list
    of strings (one string is read as a list of one); ``None`` when they are not that."""
    if isinstance(arguments, str) or arguments is None:
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            return None
    ids = arguments.get("ids") if isinstance(arguments, Mapping) else None
    if isinstance(ids, str):
        ids = [ids]
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        return None
    return ids


def recall_text(graph: ContextGraph, ids: Sequence[str] | None, counter: TokenCounter | None = None,
                max_tokens: int | None = None, unwrap: Callable[[str], str] | None = None) -> str:
    """The answer to one recall call: for each reference in ``ids``, the complete stored text
    (:meth:`~historygraph.history.graph.ContextGraph.recall_text`: a tool result by its call id, or
    the messages of a span ``#A–#B``), or ``[why not]`` for an unknown one; several are each headed
    ``tool result ID:`` or ``messages #A–#B:``. With ``max_tokens``, each text over that many tokens
    (``counter``, default the stock o200k_base counter) is cut to them and marked. ``ids`` of
    ``None`` or empty (unreadable arguments, :func:`ids_of`) is answered with :data:`USAGE`. Never
    raises for bad ids: the model reads the answer. ``unwrap``, when given, maps each stored tool
    result's text before it is cut (an adapter whose framework wraps the answer again, as
    mini-swe-agent's observation template does, passes one that takes its wrapping off)."""
    if not ids:
        return USAGE
    parts = []
    for i in ids:
        what = f"messages {i}" if i not in graph.result_of and MESSAGE_SPAN.fullmatch(i) else f"tool result {i}"
        try:
            text = graph.recall_text(i)
        except KeyError as exc:
            text = f"[{exc.args[0]}]"
        else:
            if unwrap is not None and i in graph.result_of:
                text = unwrap(text)
            if max_tokens is not None:
                counter = counter or TokenCounter()
                n = counter.count(text)
                if n > max_tokens:
                    text = counter.truncate(text, max_tokens) + f"\n[... cut: {max_tokens} of {n} tokens of {what} shown]"
        parts.append(text if len(ids) == 1 else f"{what}:\n{text}")
    return "\n\n".join(parts)


def recall_stored(store: Store, session: str | None, ids: Sequence[str] | None, counter: TokenCounter | None = None,
                  max_tokens: int | None = MAX_TOKENS, unwrap: Callable[[str], str] | None = None) -> str:
    """:func:`recall_text` over the stored ``session`` of ``store``, read at the call (results
    stored meanwhile are found); a session not stored yet (``None``: nothing rendered yet) is
    answered, not raised."""
    if session is None or not store.has_session(session):
        return f"[{TOOL_NAME}: nothing of this conversation is stored yet]"
    return recall_text(store.graph(session), ids, counter, max_tokens, unwrap)
