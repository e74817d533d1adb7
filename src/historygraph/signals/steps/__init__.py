"""ContextWeaver steps: a view of the context graph as thought–action–observation nodes.

Source: ContextWeaver §3.1 (node extraction, parent selection, ancestry) and §3.3 (validation).

* **Step** (node ``N_k``): one assistant message (thought = its text, action = its tool calls)
  with the tool results that answer it (observation). Steps are numbered 0, 1, … in transcript
  order; an assistant message without tool calls is a step without observation.
* **Files** a step touches: path-like tokens with a source/config/document extension, read from
  the thought, the action and the observation (URLs are ignored). Files are compared by file name
  (last path component), because agents name one file as ``/testbed/pkg/a.py``, ``./pkg/a.py``
  and ``a.py``. **Identifiers**, from the action and the observation: code-like names of at least
  four characters with an inner underscore (``get_offset``), an inner capital (``LintResult``,
  ``parseArgs``) or an acronym before a word (``HTTPError``). Only the first
  :data:`FEATURE_CHARS` characters of the observation are read.
* **Validation** (§3.3): each step's ``test_results`` is the :class:`~.tests.TestRun` parsed from
  its observation; ``validation_status`` comes from it (``unknown`` without one). When step ``k``
  fixes an earlier failure (:func:`~.tests.supersedes`) the earlier step becomes ``superseded``
  and ``superseded_by`` points at ``k``.
* **Parent selection** is incremental, as in the paper: when step ``k`` is added, its parents are
  chosen among earlier steps whose status *at that moment* is ``passed`` or ``unknown`` (failed and
  superseded steps are skipped). The low-cost selector (§3.3 "Low-cost configuration": shared
  files, shared identifiers, recency; the weights are ours, the paper gives none) scores a
  candidate ``i`` that shares at least one file or identifier with ``k`` by

      score(i, k) = w_files · min(|F_i ∩ F_k|, 3) + w_ids · ln(1 + |I_i ∩ I_k|) + w_rec · ρ^(k − 1 − i)

  and keeps the ``max_parents`` best (ties to the more recent). Another selector (the LLM
  analyzer) can be passed as a callable.
* **Ancestry** (§3.1): breadth-first search up the parent edges from the current step, stopping
  when the queue is empty or ``W`` ancestors are collected. Ancestors inside the always-full recent
  window and ancestors without an observation are traversed but not counted, so ``W`` bounds the
  number of *earlier* observations kept in full (the paper keeps three, §5.5).

Extracted features and chosen parents are cached per graph object (the graph is append-only), so
a replay extracts each step once. A graph handed out by a store also keeps them with the session
(:mod:`historygraph.history.derived`): a step's features as :data:`STEP_FEATURES` rows, checked against the
step's result positions; the low-cost selector's parents as :func:`parents_kind` rows, with the
number of messages the graph held when they were chosen, used only when no later message is a
result for that step or an earlier one (then every step up to it, what they were chosen from, has
the results it had), so a reopened session's first view reads them instead of recomputing them.
The whole view of a pure selector is also kept, as one :func:`view_kind` snapshot rewritten when
the graph has grown by a quarter, so that a reopened session's first view builds no step from its
rows: it starts from the snapshot, reads a step's features when first used, and extends the view
from the snapshot's length.

Modules: :mod:`~historygraph.signals.steps.features` (a step and its features: files,
identifiers, action, test run), :mod:`~historygraph.signals.steps.parents` (parent selection: the
low-cost selector and its ``from_postings``), :mod:`~historygraph.signals.steps.view` (the view
kept per graph and extended as it grows, and the ancestry) and
:mod:`~historygraph.signals.steps.stored` (a view read back from its stored snapshot).
"""
