"""The commands that read a store: ``historygraph sessions`` (list them), ``show`` (a session's
messages, one tool result, the messages a dropped-step marker stands for, what each rendering left
out: ``--omitted``) and ``render`` (what a
policy keeps of a stored session under B, message by message)."""

from __future__ import annotations

import difflib
import json
import sys
from typing import Annotated, Optional, cast

import typer
from rich.table import Table
from rich.text import Text

from historygraph.cli.common import (SHOWN_IDS, ParamOption, ParamsFileOption, SessionArgument, console, existing_store,
                                     fail, few, load_policy_params, one_budget, plural, store_name, unknown_policy)
from historygraph.history.graph import MESSAGE_SPAN, ContextGraph
from historygraph.models.chat import ModelError
from historygraph.cli.replay import SESSION_SOURCES
from historygraph.eval.sessions_view import DEFAULT_POLICY as RENDER_POLICY
from historygraph.policies import REGISTRY, PolicyError, Signals, create
from historygraph.policies.cache_stable import inspect
from historygraph.render import BudgetTooSmallError
from historygraph.render.omissions import NOTES, REASONS, calls
from historygraph.signals.tokens import DEFAULT_ENCODING, ENCODINGS, TokenCounter
from historygraph.store import StoreError


def _session_graph(db, session: str) -> tuple[str, ContextGraph]:  # noqa: ANN001
    """The stored graph of ``session``: its full id, or a trace id that ends exactly one session id
    (``openhands:output.jsonl:ISSUE`` can be named ``ISSUE``). Exits with a message naming the store."""
    sid = session
    if not db.has_session(session):
        ids = db.sessions()
        matches = [s for s in ids if s.endswith(":" + session)]
        if len(matches) != 1:
            if matches:
                fail(f"session {session!r} is ambiguous in store {store_name(db)}: {len(matches)} session ids end with "
                     f"':{session}' ({', '.join(matches[:5])}{', …' if len(matches) > 5 else ''}); give the full id")
            fail(f"no session {session!r} in store {store_name(db)}; {_did_you_mean(session, ids)}give a session id or "
                 f"its whole trace id (the part after its last ':'); list them with: historygraph sessions --store "
                 f"{store_name(db)}")
        sid = matches[0]
    try:
        return sid, db.graph(sid)
    except (KeyError, StoreError) as exc:
        fail(exc.args[0] if exc.args else str(exc))


def _did_you_mean(name: str, ids: list[str]) -> str:
    """``"did you mean A or B? "`` for the session ids that contain ``name`` (else the closest
    spellings), up to three; ``""`` when none is near."""
    near = [s for s in ids if name in s] or difflib.get_close_matches(name, ids, n=3, cutoff=0.6)
    if not near:
        return ""
    more = f" (or another of {len(near)})" if len(near) > 3 else ""
    return f"did you mean {' or '.join(near[:3])}{more}? "


def sessions(store: Annotated[Optional[str], typer.Option(help="Store path or postgresql:// URL. Default: $HISTORYGRAPH_DB, else historygraph.sqlite in the user data dir.")] = None) -> None:
    """List the sessions in a store with their event counts, and the trace file a replayed one was read from
    (a table in a terminal; piped, one tab-separated line per session)."""
    db = existing_store(store)
    infos = db.session_infos()
    paths = [str(info.meta.get("path") or "") for info in infos]
    if not console.is_terminal:  # piped (grep, a file): one tab-separated line per session, nothing cut
        print(f"# sessions in {store_name(db)}: session, events, tool results, trace file")
        for info, path in zip(infos, paths):
            print(f"{info.id}\t{info.events}\t{info.tool_results}\t{path}")
        return
    t = Table(title=f"Sessions in {store_name(db)}", header_style="bold")
    # ids whole on one line where the terminal allows (they are what render and show take), the
    # trace file wrapped; a narrower terminal wraps both, never cuts one short
    longest = max((len(info.id) for info in infos), default=7)
    t.add_column("session", overflow="fold", min_width=min(longest, max(20, console.width - 60)))
    for c in ("events", "tool results") + (("trace file",) if any(paths) else ()):
        t.add_column(c, overflow="fold")
    for info, path in zip(infos, paths):
        t.add_row(info.id, str(info.events), str(info.tool_results), *((path,) if any(paths) else ()))
    console.print(t)


def show(session: SessionArgument, result: Annotated[Optional[str], typer.Option(help="Print one stored tool result by its id.")] = None,
         message: Annotated[Optional[str], typer.Option(help="Print stored messages by number or span, as a "
                                                             "dropped-step marker names them: '16' or '16-23'.")] = None,
         omitted: Annotated[bool, typer.Option("--omitted", help="Print what each rendering for a model call left out "
                                                                  "and why, per call (ids, tokens, reason).")] = False,
         as_json: Annotated[bool, typer.Option("--json", help="With --omitted: print the calls as JSON.")] = False,
         store: Annotated[Optional[str], typer.Option(help="Store path or postgresql:// URL. Default: $HISTORYGRAPH_DB, else historygraph.sqlite in the user data dir.")] = None) -> None:
    """Print a stored session as OpenAI messages, one complete tool result by id, the messages a
    dropped-step marker stands for, or what each rendering left out (--omitted)."""
    if as_json and not omitted:
        fail("--json goes with --omitted (the session itself is printed as JSON already)")
    db = existing_store(store)
    session, g = _session_graph(db, session)
    if omitted:
        _show_omitted(db, session, g, as_json)
    elif message:
        if not MESSAGE_SPAN.fullmatch(message):
            fail(f"--message {message!r}: give a message number or span, e.g. 16 or 16-23")
        try:
            sys.stdout.write(g.recall_text(message) + "\n")
        except KeyError as exc:
            fail(exc.args[0])
    elif result:
        try:
            sys.stdout.write(g.result_by_id(result).content)  # byte for byte: no wrapping, no added newline
        except KeyError as exc:
            fail(f"{exc.args[0]}; 'historygraph render {session} --store {store_name(db)}' lists its tool call ids")
    else:
        console.print_json(json.dumps([m.to_openai() for m in g.messages]))


def _show_omitted(db, session: str, g: ContextGraph, as_json: bool) -> None:  # noqa: ANN001
    """``show --omitted``: a table per call (or JSON: :func:`historygraph.render.omissions.calls`)."""
    try:
        per_call = calls(db.omitted(session), g, TokenCounter(DEFAULT_ENCODING))
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        console.print_json(json.dumps({"session_id": session, "calls": per_call, "reasons": REASONS}))
        return
    if not per_call:
        console.print(f"no renderings recorded for session {session} in {store_name(db)} (records are kept for "
                      f"Session.render, render_messages with a session and proxied requests, not for a replay; a store "
                      f"open in a running program writes them at its next append, flush() or close()); to see "
                      f"what a policy leaves out of it now: historygraph render {session} -p POLICY -b BUDGET "
                      f"--store {store_name(db)}", markup=False)
        return
    for c in per_call:
        note = "".join(f", {k.replace('_', ' ')} (B asked {c[k]})" for k in NOTES if k in c)
        # the heading on its own line: as a table's title it wrapped to the width of a narrow (or empty) table
        console.print(f"call {c['call']}: {c['policy']} at B = {c['budget']}, history {plural(c['history_tokens'], 'token')}, "
                      f"{plural(c['omitted'], 'tool result')} omitted of {plural(c['events'], 'message')}{note}",
                      markup=False, highlight=False, soft_wrap=True, style="italic")
        if not c["items"]:
            continue
        t = Table(header_style="bold")
        for col in ("pos", "kind", "tool call id", "tokens", "reason"):
            t.add_column(col, justify="right" if col in ("pos", "tokens") else "left")
        for o in c["items"]:
            pos = str(o["position"]) if o["last"] == o["position"] else f"{o['position']}-{o['last']}"
            t.add_row(pos, o["kind"], Text(o["id"] or ""), str(o["tokens"]), o["reason"])
        console.print(t)
    used = sorted({o["reason"] for c in per_call for o in c["items"]})
    for code in used:
        console.print(f"{code}: {REASONS[code]}", markup=False, highlight=False)


def render(
    session: SessionArgument,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Policy to render with (default: the proxy's and the "
                                                               "library's, learned-stable).")] = RENDER_POLICY,
    budget_text: Annotated[Optional[str], typer.Option("--budget", "-b", help=(
        "History budget B in tokens (a whole number >= 1). Default: 32000 for a Claude Code or Codex session log "
        "(the middle of the budgets 'replay' gives them), else 6000."))] = None,
    at: Annotated[Optional[int], typer.Option(min=1, help="Render the input of the model call that produced assistant "
                                                          "message #AT (messages #0..#AT-1). Default: all, the next call.")] = None,
    encoding: Annotated[str, typer.Option(help=f"Tokenizer: {', '.join(ENCODINGS)}.")] = DEFAULT_ENCODING,
    store: Annotated[Optional[str], typer.Option(help="Store path or postgresql:// URL. Default: $HISTORYGRAPH_DB, else historygraph.sqlite in the user data dir.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rendered OpenAI messages instead of the table.")] = False,
    param: ParamOption = [],
    params_file: ParamsFileOption = None,
) -> None:
    """Show what a policy keeps of a stored session under B: each message's form, tokens and reason,
    and the ids of the omitted tool results (fetch one with 'show SESSION --result ID')."""
    given = one_budget(budget_text) if budget_text is not None else None  # checked before any work
    if policy not in REGISTRY:
        unknown_policy(policy)
    if encoding not in ENCODINGS:
        fail(f"unknown encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}")
    params = load_policy_params(param, params_file, [policy]).get(policy, {})
    db = existing_store(store)
    session, full = _session_graph(db, session)
    log = db.session_meta(session).get("source") in SESSION_SOURCES
    budget = given if given is not None else (32000 if log else 6000)
    if at is not None and at > len(full):
        fail(f"--at {at}: session {session!r} has only {len(full)} messages (#0–#{len(full) - 1}); give the number of "
             f"an assistant message, or leave --at out for its next call")
    if at is not None and at < len(full) and full.messages[at].role != "assistant":
        # messages[:at] is the input of no model call: it would end inside a step (a call without its result)
        calls = [p for p, m in enumerate(full.messages) if m.role == "assistant" and p > 0]
        before, after = [p for p in calls if p < at][-1:], [p for p in calls if p > at][:1]
        near = [f"#{p}" for p in before + after]
        fail(f"--at {at}: message #{at} is a {full.messages[at].role} message, not one a model call produced; give the "
             f"number of an assistant message (the call's input is every message before it)"
             + (f": the nearest are {' and '.join(near)}" if near else ""))
    graph = ContextGraph(session, full.messages[:at]) if at is not None else full
    signals = Signals(counter=TokenCounter(encoding), store=db)
    try:
        r = inspect(create(policy, **params), graph, budget, signals)  # a cache-stable policy's state is left as it was
    except PolicyError as exc:
        fail(str(exc))
    except BudgetTooSmallError as exc:
        fail(f"{exc} (raise --budget)")
    except ModelError as exc:
        fail(f"{exc} (needed by policy {policy}; configure an endpoint or choose another policy)")
    if as_json:
        console.print_json(json.dumps(r.to_openai()))
        return
    shown = {p: m for m, p in zip(r.messages, r.positions) if p is not None}
    synthetic: dict[int, list] = {}  # graph position -> synthetic messages rendered right after it
    last = -1
    for m, p in zip(r.messages, r.positions):
        if p is None:
            synthetic.setdefault(last, []).append(m)
        else:
            last = p
    low = r.stats.get("rendered_to")  # a cache-stable re-selection renders below B, to append after it
    t = Table(title=f"{policy} at B = {budget}: session {session} ({len(graph)} messages) in {store_name(db)}"
              + (f"; re-selected here to {low} tokens (the cache-stable low mark, 0.75·B by default), so that the next calls "
                 "append up to B" if low else ""),
              header_style="bold")
    for c in ("pos", "role", "tool call id", "form", "tokens", "reason"):
        t.add_column(c, justify="right" if c in ("pos", "tokens") else "left")
    for p, m in enumerate(graph.messages):
        out = shown.get(p)
        form = "dropped" if out is None else (out.rendered_as or "full")
        tokens = "–" if out is None else str(signals.counter.count_message(out))
        t.add_row(str(p), m.role, m.tool_call_id or "", form, tokens, Text(r.reasons.get(p, "")))  # Text: no markup
        for extra in synthetic.get(p, ()):
            t.add_row("+", extra.role, extra.tool_call_id or "", extra.rendered_as or "synthetic",
                      str(signals.counter.count_message(extra)), Text("added by the policy: " + extra.content[:120]))
    console.print(t)
    ids = [cast(str, graph.messages[p].tool_call_id) for p in r.omitted]  # (a result answers a call: it has its id)
    console.print(f"history {r.history_tokens} / {plural(budget, 'token')} (whole input {plural(r.input_tokens, 'token')}); "
                  f"{plural(len(r.full), 'tool result')} full, {len(ids)} omitted")
    if ids:  # a long list abbreviated: the table above has every message with its tool call id
        console.print("omitted result ids: " + few(ids) + ("" if len(ids) <= SHOWN_IDS else " (all in the table above)"),
                      markup=False, highlight=False, soft_wrap=True)
        console.print(f"fetch one with: historygraph show {session} --result {ids[0]} --store {store_name(db)}",
                      markup=False, highlight=False, soft_wrap=True)

