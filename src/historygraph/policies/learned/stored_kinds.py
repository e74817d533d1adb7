"""The kinds of derived rows (:mod:`historygraph.history.derived`) the learned selector keeps with
a stored session: a tool result's regular-expression facts, the task's facts and the per-graph
state's snapshot. Each kind's version is a digest of the modules that compute it, so a change to
any of them makes a reopened session compute the kind again."""

from __future__ import annotations

from historygraph.history.derived import DerivedKind
from historygraph.signals.steps.features import STEP_MODULES

_LEARNED = "historygraph.policies.learned."

RESULT_FACTS = DerivedKind("learned.facts", (_LEARNED + "result_facts", _LEARNED + "facts_cache", *STEP_MODULES))
"""Derived rows per message: a tool result's ``[kind, command, call files, content files,
identifiers, words, error]`` (sorted lists), an assistant message's ``[identifiers]``."""

TASK_FACTS = DerivedKind("learned.task", (_LEARNED + "result_facts", _LEARNED + "facts_cache", *STEP_MODULES,
                                          "historygraph.history.reuse"))
"""A derived row at the position of the task (the first user message): ``[values, words,
identifiers]`` of its text (sorted lists), so that a reopened session's first render does not run
the extractors over the task again (a long prompt)."""

FACTS_SNAPSHOT = DerivedKind("learned.graph", (_LEARNED + "result_facts", _LEARNED + "flat_tables",
                                               _LEARNED + "graph_state", _LEARNED + "snapshot",
                                               _LEARNED + "facts_cache", *STEP_MODULES, "historygraph.history.reuse",
                                               "historygraph.history.graph", "historygraph.history.derived"))
"""A derived row (position 0) holding the per-graph state of
:func:`~historygraph.policies.learned.facts_cache.graph_facts` at a known number of messages
(:mod:`historygraph.policies.learned.snapshot`), rewritten when the session has grown by a quarter
(as the step view's snapshot, :data:`historygraph.history.derived.SNAPSHOT_GROWTH`), so that a
reopened session's first render starts from it instead of rebuilding every result's facts."""
