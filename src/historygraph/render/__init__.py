"""Assembly of a rendering and the invariants every rendering must hold (docs/architecture.md, invariant §5).

Every policy renders through :class:`Layout`, so budget accounting and tool-call pairing are
implemented once:

* **Scope of B** (ContextRender A.4): system messages and the *current user message* (the latest
  user message) are separate model-input components and are not charged to B. Everything else
  (earlier user messages, assistant messages with their tool calls, tool results, placeholders)
  is. Tool schemas are not part of the stored history and are not counted.
* **Non-tool history is charged first** (A.4): the base cost is every retained user/assistant
  message plus, for each tool result, a short placeholder that names the result's id. Showing a
  result in full costs ``tok(result) − tok(placeholder)`` more. A call whose result is not shown
  therefore still gets an answer, so a provider never sees an orphaned call (our decision where
  the paper is silent; the placeholder is charged to B).
* **Retained non-tool history alone exceeds B**: the oldest units (an assistant message with its
  calls and results, or a user message) are dropped, each with a reason, until the base fits in
  half of B, leaving the other half for results; a dropped step comes back when a policy selects
  one of its results, and its assistant message is then charged too. The first user message,
  the current user message, system messages, the latest assistant message (the current turn,
  which may hold an in-flight call) and, when it opens with a thinking block, the first assistant
  message of the active tool loop with the user message that starts its exchange and the
  assistant message before that (:func:`loop_guard`), and the message of the agent's latest
  todo list or plan (:mod:`~historygraph.render.plan`) are protected. When even the
  protected part exceeds B, :class:`BudgetTooSmallError` says by how many tokens.
* **Provider order** (docs/architecture.md, invariant §5.2, §5.7): a rendering shows each tool result directly after the
  assistant message that made its call, even when another message (a user note, a summary) was
  stored between the call and its result; the interposed message follows the results
  (:func:`render_order`). Everything else stays chronological.
* **A late second result** for one call: both are stored; the latest is rendered (after its call),
  each earlier one is listed in ``dropped`` with its reason (``ContextGraph.superseded``).
* **Unanswered calls**: a call with no stored result that is not in the latest assistant message
  is answered by a synthetic result saying so; a call in the latest assistant message is in
  flight and is rendered without a result (docs/architecture.md, invariant §5.4).

Token counts are in tokens of the :class:`~historygraph.signals.tokens.TokenCounter` encoding.

The package, by what each module holds:

* :mod:`~historygraph.render.rendering`: :class:`Rendering` (what a policy returns) and the errors;
* :mod:`~historygraph.render.markers`: the placeholders, synthetic answers, dropped-step markers,
  excerpts and brief views that stand in for what is left out, and their templates;
* :mod:`~historygraph.render.order`: the render order and the active tool loop's opening;
* :mod:`~historygraph.render.plan`: the agent's latest todo list or plan, shown in every rendering (§5.10);
* :mod:`~historygraph.render.layout`: :class:`Layout`, the shared budget accounting, with
  :mod:`~historygraph.render.pricing` (what dropping and reviving steps costs, the oldest-first
  drop) and :mod:`~historygraph.render.assemble` (the rendering built from a selection);
* :mod:`~historygraph.render.selection`: :class:`Selection`, the budget state of one greedy pass;
* :mod:`~historygraph.render.invariants`: :func:`check_invariants`, docs/architecture.md §5;
* ``_memo``, ``_skeleton``, ``_units``, ``_grow``, ``_facts``: speed only (per-graph memos and the
  compact forms of units and runs); each says which plain computation it must equal.
"""

from historygraph.render.invariants import check_invariants
from historygraph.render.layout import Layout
from historygraph.render.markers import (BRIEF, COMPRESSED_GAP, COMPRESSED_PREFIX, DROPPED_MARK, EXCERPT_MARK, PLACEHOLDER,
                                         SEGMENT_JOIN, UNANSWERED, dropped_marker, excerpt_for, oversized_excerpt,
                                         placeholder_for)
from historygraph.render.order import kept_render_order, loop_guard, loop_opening, render_order
from historygraph.render.rendering import BudgetTooSmallError, InvariantError, Rendering
from historygraph.render.selection import Selection

__all__ = [
    "BRIEF", "COMPRESSED_GAP", "COMPRESSED_PREFIX", "DROPPED_MARK", "EXCERPT_MARK", "PLACEHOLDER", "SEGMENT_JOIN",
    "UNANSWERED", "BudgetTooSmallError", "InvariantError", "Layout", "Rendering", "Selection", "check_invariants",
    "dropped_marker", "excerpt_for", "kept_render_order", "loop_guard", "loop_opening", "oversized_excerpt",
    "placeholder_for", "render_order",
]
