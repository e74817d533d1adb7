"""A ContextWeaver step (§3.1) and its features: the action (each call as ``name: command``), the
files and code-like identifiers of the thought, action and observation head, and the test run of
the observation (§3.3); each step's kept with a stored session as a :data:`STEP_FEATURES` row.
The rules are in :mod:`historygraph.signals.steps`."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Callable

from historygraph.history.derived import DerivedKind
from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.signals.test_output import TestRun, parse_test_output, validation_status

STEP_MODULES = ("historygraph.signals.steps.features", "historygraph.signals.steps.parents",
                "historygraph.signals.steps.stored", "historygraph.signals.steps.view", "historygraph.signals.test_output")
"""The modules of the step view, whose source is the version of every kind of step rows (features,
parents, whole views: one version for all, as the view's code computes each of them)."""
STEP_FEATURES = DerivedKind("steps.features", STEP_MODULES)
"""Derived rows of each step, at its assistant message's position: ``[results, action, files,
identifiers, test run]`` (:func:`run_data`), used only for the same result positions."""


FEATURE_CHARS = 20_000
_EXT = ("py|pyi|pyx|js|jsx|ts|tsx|go|rs|java|kt|c|h|cc|cpp|hpp|cs|rb|php|swift|scala|sh|sql|json|ya?ml|toml|"
        "cfg|ini|txt|md|rst|html|css|xml|csv|lock|dcm")
_FILE = re.compile(rf"(?<![\w.\-/])(/?(?:[\w.\-]+/)*[\w\-][\w.\-]*\.(?:{_EXT}))(?![\w\-])")
_URL = re.compile(r"\w+://\S+")
_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]{3,}\b")
_CODE_LIKE = re.compile(r"[A-Za-z0-9]_[A-Za-z0-9]|[a-z][A-Z]|[A-Z]{2}[a-z]")


def files_in(text: str) -> frozenset[str]:
    """File names (last path component) of the paths in ``text`` (kept for the latest texts
    asked about: :func:`_recall`)."""
    return _recall(0, text, _files_in)


def identifiers_in(text: str) -> frozenset[str]:
    """Code-like identifiers in ``text`` (rule in the module docstring; kept for the latest texts
    asked about: :func:`_recall`)."""
    return _recall(1, text, _identifiers_in)


_PATH_RUN = re.compile(r"[\w.\-/]+")  # the characters of _FILE's paths and of its lookbehind
_FILE_AT = re.compile(rf"/?(?:[\w.\-]+/)*[\w\-][\w.\-]*\.(?:{_EXT})(?![\w\-])")  # _FILE without the lookbehind


def _files_in(text: str) -> frozenset[str]:
    """``_FILE.findall`` of ``text`` with URLs blanked (``_URL.sub``), as the start of each longest
    run of path characters (``[\\w.\\-/]``) that ``_FILE_AT`` matches there: _FILE's lookbehind lets
    a path start only where no path character precedes it, that is at such a run's start, and a
    path is made of them, so each run holds at most one (a scan of every position cost ≈ 0.3 µs a
    character); runs without a dot hold none. ``tests/test_contextweaver.py`` checks it against
    ``_FILE`` on real traces."""
    if "://" in text:  # (no URL without it)
        text = _URL.sub(" ", text)
    out = set()
    match = _FILE_AT.match
    for run in _PATH_RUN.findall(text):
        if "." in run and (m := match(run)) is not None:
            out.add(m.group().rsplit("/", 1)[-1])
    return frozenset(out)


def _identifiers_in(text: str) -> frozenset[str]:
    return frozenset(t for t in set(_IDENT.findall(text)) if _CODE_LIKE.search(t))  # each distinct token tested once


_RECALL: dict[tuple[int, str], frozenset[str]] = {}
_RECALL_SIZE = 128   # texts kept (a render asks about a few new ones)
_RECALL_CHARS = 128  # shorter texts are not kept (matching them costs about what a lookup does)


def _recall(kind: int, text: str, fn: Callable[[str], frozenset[str]]) -> frozenset[str]:
    """``fn(text)``, kept for the last :data:`_RECALL_SIZE` texts: a new result's text is matched
    for the learned selector's facts (:mod:`historygraph.policies.learned.features`) and for its step
    (:func:`extract`, one result at a time), the latest assistant message's for its facts and
    for the render's features. A string's hash is computed once per string object."""
    if len(text) < _RECALL_CHARS:
        return fn(text)
    key = (kind, text)
    hit = _RECALL.get(key)
    if hit is None:
        if len(_RECALL) >= _RECALL_SIZE:
            _RECALL.clear()
        hit = _RECALL[key] = fn(text)
    return hit


def action_text(graph: ContextGraph, position: int) -> str:
    """The action of the assistant message at ``position``: each call as ``name: command`` (the
    ``command``/``cmd`` argument when the arguments are JSON with one, else the raw arguments)."""
    return _action_of(graph.messages[position])


def _action_of(message: Message) -> str:
    """:func:`action_text` of ``message``."""
    parts = []
    for c in message.tool_calls:
        args = c.arguments
        try:
            data = json.loads(args)
        except ValueError:
            data = None
        command = data.get("command", data.get("cmd")) if isinstance(data, dict) else None
        if isinstance(command, str):
            args = command
        parts.append(f"{c.name}: {args}")
    return "\n".join(parts)


@dataclass
class Step:
    """One node ``N_k`` (see module docstring).

    Attributes:
        index: step number ``k`` (0-based, transcript order).
        position: graph position of the assistant message.
        results: graph positions of its tool results (the observation), in call order.
        thought, action: the assistant text and :func:`action_text`.
        files, identifiers: features of action + observation.
        test_results: the parsed test run of the observation, or ``None``.
        validation_status: ``passed``, ``failed``, ``unknown`` or ``superseded``.
        superseded_by: index of the step that fixed this failure, or ``None``.
        parents: indices of the steps it builds on, most important first.
        summary: the node summary once a policy has made one (≤ 300 characters), else ``None``.
    """

    index: int
    position: int
    results: tuple[int, ...]
    thought: str
    action: str
    files: frozenset[str]
    identifiers: frozenset[str]
    test_results: TestRun | None
    validation_status: str = "unknown"
    superseded_by: int | None = None
    parents: tuple[int, ...] = ()
    summary: str | None = None


_GRAPH_CACHE = "signals.steps"  # graph.memo key of graph_cache


def graph_cache(graph: ContextGraph) -> dict:
    """Per graph: ``features`` (a step's, by position and results), ``parents`` (by selector, step
    and results), ``lock`` (held by :mod:`~historygraph.signals.steps.view` while it reads or extends
    them, as renders of one graph in two threads share them) and, kept by that module, its views
    and their inverted index."""
    return graph.memo(_GRAPH_CACHE, lambda: {"features": {}, "parents": {}, "lock": threading.RLock()})


def run_data(run: TestRun | None) -> list | None:
    """A test run as JSON-ready data (the inverse of :func:`run_of`)."""
    if run is None:
        return None
    return [run.framework, run.passed, run.failed, run.errors, run.skipped, run.results, [list(t) for t in run.tracebacks]]


def run_of(data: list | None) -> TestRun | None:
    if data is None:
        return None
    framework, passed, failed, errors, skipped, results, tracebacks = data
    return TestRun(framework, passed, failed, errors, skipped, dict(results), tuple((a, b) for a, b in tracebacks))


def extract(messages: list, position: int, results: tuple[int, ...], with_run: bool = True) -> tuple:
    """``(action, files, identifiers, test run)`` of the step at ``position`` with ``results``
    (the run ``None`` unless ``with_run``)."""
    m = messages[position]
    action = _action_of(m)
    contents = [messages[p].content for p in results]
    obs = "\n".join(contents)
    pieces = _head_pieces(contents, obs)
    files = files_in(action).union(files_in(m.content), *map(files_in, pieces))
    idents = identifiers_in(action).union(*map(identifiers_in, pieces))
    return (action, files, idents, parse_test_output(obs) if obs and with_run else None)


def _head_pieces(contents: list[str], obs: str) -> list[str]:
    """The first :data:`FEATURE_CHARS` characters of ``obs`` (``contents`` joined by newlines) cut
    at the newlines that join them: the whole contents that fit, then what fits of the next. No
    file name or identifier holds a newline or is cut by one (the patterns' classes and lookarounds
    exclude it, and a newline is a boundary as the text's ends are), so those of the joined text
    (``files_in(a + "\\n" + b)``) are those of its pieces together, and a result's own text, as
    its learned facts ask about it, is matched once (:func:`_recall`)."""
    out: list[str] = []
    at = 0
    for c in contents:
        if at + len(c) > FEATURE_CHARS:
            out.append(obs[at:FEATURE_CHARS])
            break
        out.append(c)
        at += len(c) + 1
        if at > FEATURE_CHARS:
            break
    return out


def step_features(graph: ContextGraph, index: int, position: int, results: tuple[int, ...], cache: dict | None = None) -> Step:
    if cache is None:
        cache = graph_cache(graph)["features"]
    key = (position, results)
    if key not in cache:
        row = graph.derived.take_value(STEP_FEATURES, position)
        if row is not None and tuple(row[0]) == results:
            cache[key] = (row[1], frozenset(row[2]), frozenset(row[3]), run_of(row[4]))
        else:
            cache[key] = feats = extract(graph.messages, position, results)
            graph.derived.put(STEP_FEATURES, position, [list(results), feats[0], sorted(feats[1]), sorted(feats[2]),
                                                        run_data(feats[3])])
    action, files, idents, run = cache[key]
    return Step(index, position, results, graph.messages[position].content, action, files, idents, run,
                validation_status(run))
