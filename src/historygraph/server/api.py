"""The session API, for adapters and inspection (documented by the app's OpenAPI schema at
``/openapi.json`` and ``/docs``).

* ``GET  /api/sessions``: every session with its event and tool-result counts and its parent;
* ``GET  /api/sessions/{id}``: one session's meta and stored messages (OpenAI form);
* ``POST /api/sessions/{id}/events``: append events (creates the session when ``create`` is true);
  safe to retry with an ``Idempotency-Key`` header, and appends only at ``expected_length`` when
  that is given (409 otherwise; see :func:`append_events`);
* ``POST /api/sessions/{id}/render``: a rendering for a policy and budget, with selected, omitted
  and dropped ids, tokens and per-item reasons;
* ``GET  /api/sessions/{id}/results/{tool_call_id}``: one complete stored tool result, so that an
  agent tool can restore a result a rendering omitted;
* ``POST /api/sessions/{id}/pins`` (``{"id": <tool call id | "#n" | position>}``) and
  ``DELETE /api/sessions/{id}/pins/{item}``: pin an item so that every rendering shows it whole, or
  unpin it (docs/proxy.md, "Pins"); both answer the session's pins, which ``GET /api/sessions/{id}``
  lists too; an item the session does not hold is a 404 naming it.
* ``GET  /api/sessions/{id}/omitted``: what each proxied request's rendering left out and why
  (:mod:`historygraph.render.omissions`), one entry per call, oldest first.

Session ids (:func:`historygraph.history.sessions.session_id_problem`): any text of 1 to 512
characters without control characters; in a path, the id is one segment, percent-encoded where
it needs to be (``/`` as ``%2F``, ``%`` as ``%25``, a space as ``%20``): every id
``GET /api/sessions`` lists is read at ``/api/sessions/<quote(id, safe="")>``
(:class:`EncodedSegments`). Creating a session whose id is not allowed is a 400 naming
``session_id``; reading one is a 404 (no such session can exist).

When the server has an auth token, every route here requires ``Authorization: Bearer <token>``
(401 otherwise). Errors are ``{"detail": …}`` with the field named.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Annotated, Any
from urllib.parse import unquote

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr
from starlette.concurrency import run_in_threadpool

from historygraph.history.events import EventError, Message, check_media
from historygraph.history.graph import ContextGraph
from historygraph.history.sessions import session_id_problem
from historygraph.policies import PolicyError, check_production
from historygraph.providers.jsonio import UnusableJSON, usable
from historygraph.render.omissions import REASONS, calls
from historygraph.store import KEPT_KEYS, AppendConflict, StoreError, StoreFullError
from historygraph.store.appends import MAX_KEY_LENGTH
from historygraph.server.errors import ClientError

log = logging.getLogger("historygraph.server")


def _auth(request: Request) -> None:
    token = request.app.state.proxy.config.auth_token
    if token is None:
        return
    got = request.headers.get("authorization", "")
    if not (got.startswith("Bearer ") and secrets.compare_digest(got[7:].encode(), token.encode())):
        raise HTTPException(401, "session API: missing or wrong bearer token (Authorization: Bearer <token>)",
                            headers={"WWW-Authenticate": "Bearer"})


router = APIRouter(prefix="/api", tags=["sessions"], dependencies=[Depends(_auth)])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SessionSummary(BaseModel):
    id: str
    events: int
    tool_results: int
    parent: str | None = None


class Pin(BaseModel):
    id: str = Field(description="The item: a tool result's call id, else its message number ('#3').")
    position: int = Field(description="Its graph position.")


class SessionDetail(BaseModel):
    id: str
    meta: dict[str, Any]
    messages: list[dict[str, Any]] = Field(description="Stored events, OpenAI chat form, oldest first.")
    pins: list[Pin] = Field(description="Pinned items, oldest first: shown whole in every rendering.")


class PinRequest(_Strict):
    # strict: JSON true is not the position 1, nor 1.5 the position 1 (422 for both)
    id: StrictStr | StrictInt = Field(description="The item to pin: a tool call id (its result), a message number "
                                                  "such as '#3', or a graph position.")


class PinsResponse(BaseModel):
    pins: list[Pin] = Field(description="The session's pinned items after the change, oldest first.")


class AppendRequest(_Strict):
    messages: list[dict[str, Any]] = Field(description="Events in OpenAI chat form.")
    create: bool = Field(False, description="Create the session when it does not exist.")
    expected_length: int | None = Field(None, ge=0, description="Append only if the session holds exactly this "
                                        "many events; else 409 with the current length.")


class AppendResponse(BaseModel):
    positions: list[int] = Field(description="Graph positions of the appended events.")


class Conflict(BaseModel):
    detail: str
    length: int = Field(description="The session's current number of events.")


class RenderRequest(_Strict):
    policy: str | None = Field(None, description="Registered policy name; default: the server's.")
    budget: int | None = Field(None, ge=1, description="History budget B in tokens; default: the server's.")


class RenderResponse(BaseModel):
    policy: str
    budget: int
    messages: list[dict[str, Any]] = Field(description="The rendered model input, OpenAI chat form.")
    positions: list[int | None] = Field(description="Graph position of each rendered message (null: synthetic).")
    selected: list[int] = Field(description="Positions of tool results rendered complete.")
    selected_ids: list[str] = Field(description="Tool-call ids of the results rendered complete.")
    omitted: list[int] = Field(description="Positions of tool results not rendered complete.")
    omitted_ids: list[str]
    dropped: list[int] = Field(description="Positions of messages left out entirely.")
    history_tokens: int = Field(description="Tokens charged to the budget.")
    input_tokens: int = Field(description="Tokens of the whole rendered message list.")
    reasons: dict[int, str] = Field(description="Per-position explanation of the decision.")


class OmittedItem(BaseModel):
    position: int = Field(description="First stored position (message number) of the item.")
    last: int = Field(description="Last stored position (a span of dropped messages), else = position.")
    kind: str = Field(description="tool_result, the role of one message, or 'messages' for a span.")
    id: str | None = Field(description="Tool call id of a tool result.")
    tokens: int = Field(description="Tokens of the stored item(s): what showing it complete would cost.")
    reason: str = Field(description="Reason code (see 'reasons').")


class OmittedCall(BaseModel):
    call: int = Field(description="1 for the session's first recorded rendering, 2 for the next, ...")
    events: int = Field(description="Messages of the session the rendering was made from.")
    policy: str
    budget: int | None = Field(description="History budget B in tokens.")
    history_tokens: int = Field(description="Tokens charged to B.")
    omitted: int = Field(description="Tool results not rendered complete.")
    over_budget: int | None = Field(None, description="B asked for, when the smallest valid rendering was sent over it.")
    client_curated: int | None = Field(None, description="B asked for, when the client's own context was forwarded as sent.")
    items: list[OmittedItem]


class OmittedResponse(BaseModel):
    session_id: str
    calls: list[OmittedCall]
    reasons: dict[str, str] = Field(description="What each reason code means.")


class ToolResultResponse(BaseModel):
    id: str
    position: int
    name: str | None
    content: str
    media: list[dict[str, Any]] = Field(default_factory=list, description=(
        "the result's images, documents, files and audio, whole (base64 data included), as the client sent them"))


def _proxy(request: Request) -> Any:
    return request.app.state.proxy


def _known(proxy: Any, session_id: str) -> None:
    # an id with a control character cannot have been stored (and a NUL cannot be looked up on PostgreSQL)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in session_id) or not proxy.store.has_session(session_id):
        raise HTTPException(404, f"session_id: no session {session_id!r}")


class EncodedSegments:
    """ASGI middleware: a session API path is routed segment by segment as the client encoded it,
    so that an id holding ``/`` (sent as ``%2F``) stays one path parameter. Starlette routes on
    the decoded path, where ``a%2Fb`` has become two segments; for a path under ``/api/`` with a
    percent escape, the routed path is rebuilt from the raw one with each segment decoded on its
    own and only ``%`` and ``/`` kept escaped in it (``%25``, ``%2F``), which :func:`segment`
    decodes in the route."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw and b"%" in raw and scope["path"].startswith("/api/"):
            parts = [unquote(p).replace("%", "%25").replace("/", "%2F") for p in raw.decode("latin-1").split("/")]
            scope = {**scope, "path": "/".join(parts)}
        await self.app(scope, receive, send)


def segment(value: str) -> str:
    """A path parameter of the session API as the client meant it (see :class:`EncodedSegments`)."""
    return unquote(value) if "%" in value else value


@router.get("/calibration")
def calibration(request: Request) -> dict[str, Any]:
    """Our token estimates against the provider's reported prompt tokens: observations, median
    ratio (reported / estimated) and the largest absolute error in tokens."""
    proxy = _proxy(request)
    return {**proxy.calibration.summary(), "applied": proxy.config.calibrate,
            "default_budget": proxy.config.budget,
            "calibrated_default_budget": proxy.calibration.adjusted_budget(proxy.config.budget)
            if proxy.config.calibrate else proxy.config.budget}


@router.get("/sessions", response_model=list[SessionSummary])
def list_sessions(request: Request) -> list[SessionSummary]:
    return [SessionSummary(id=i.id, events=i.events, tool_results=i.tool_results, parent=i.meta.get("parent"))
            for i in _proxy(request).store.session_infos()]


@router.get("/sessions/{session_id}", response_model=SessionDetail)
def read_session(session_id: str, request: Request) -> SessionDetail:
    proxy = _proxy(request)
    session_id = segment(session_id)
    _known(proxy, session_id)
    return SessionDetail(id=session_id, meta=proxy.store.session_meta(session_id),
                         messages=[m.to_dict() for m in proxy.store.messages(session_id)], pins=_pins(proxy, session_id))


def _pins(proxy: Any, session_id: str) -> list[Pin]:
    graph = proxy.store.graph(session_id)
    return [Pin(id=graph.item_id(p), position=p) for p in proxy.store.pins(session_id)]


def _pin(request: Request, session_id: str, item: str | int, pinned: bool) -> PinsResponse:
    proxy = _proxy(request)
    _known(proxy, session_id)
    with proxy.router.lock(session_id):
        try:
            if not pinned and (p := proxy.store.graph(session_id).position_of(item)) not in proxy.store.pins(session_id):
                raise HTTPException(404, f"item: {item!r} (message #{p}) is not pinned in session {session_id!r}; its pins: "
                                         f"{', '.join(pin.id for pin in _pins(proxy, session_id)) or 'none'}")
            proxy.store.pin(session_id, item, pinned)
        except KeyError as exc:
            raise HTTPException(404, f"{'id' if pinned else 'item'}: {exc.args[0]}") from None
        return PinsResponse(pins=_pins(proxy, session_id))


@router.post("/sessions/{session_id}/pins", response_model=PinsResponse)
def pin_item(session_id: str, body: PinRequest, request: Request) -> PinsResponse:
    """Pin an item: every later rendering of the session shows it whole, whatever the policy; a
    budget that cannot hold it makes ``/render`` a 400 naming the pins, and a proxied request is
    forwarded over B as for the rest of the protected history. Pinning twice changes nothing."""
    return _pin(request, segment(session_id), body.id, True)


@router.delete("/sessions/{session_id}/pins/{item}", response_model=PinsResponse)
def unpin_item(session_id: str, item: str, request: Request) -> PinsResponse:
    """Unpin an item (``item``: as for pinning, percent-encoded in the path: ``#3`` as ``%233``);
    an item that is not pinned is a 404 naming it, as is one the session does not hold."""
    return _pin(request, segment(session_id), segment(item), False)


@router.post("/sessions/{session_id}/events", response_model=AppendResponse,
             responses={409: {"model": Conflict, "description": "Idempotency-Key reused with another body, or the "
                                                                "session's length is not expected_length."}})
def append_events(session_id: str, body: AppendRequest, request: Request,
                  idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", description=(
                      f"Retry key (1 to {MAX_KEY_LENGTH} characters): the same key with the same messages and "
                      f"expected_length returns the first answer and stores nothing; another body gets 409. Kept "
                      f"for the session's last {KEPT_KEYS} keyed appends."))] = None) -> Any:
    """Append events. With ``Idempotency-Key`` the key is committed with the events, so a request
    whose answer was lost can be re-sent: it is answered with the first positions. ``create`` is
    not part of what must match (a retry may find the session the first attempt created)."""
    proxy = _proxy(request)
    session_id = segment(session_id)
    if body.create and (problem := session_id_problem(session_id)):
        raise HTTPException(400, f"session_id: {problem}")
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_KEY_LENGTH:
        raise HTTPException(400, f"Idempotency-Key: must be 1 to {MAX_KEY_LENGTH} characters, got {len(idempotency_key)}")
    if not body.create:
        _known(proxy, session_id)
    try:  # what no provider reads nor the store keeps (a lone surrogate, NaN): as the proxy refuses it
        usable(body.messages, "messages")
    except UnusableJSON as exc:
        raise HTTPException(400, f"{exc}; nothing was stored") from None
    batch = []
    for i, m in enumerate(body.messages):
        try:
            if isinstance(m.get("media"), str):  # the stored form (Message.to_dict): checked as content is
                check_media(m["media"])
            batch.append(Message.from_openai(m))
        except EventError as exc:
            raise HTTPException(400, f"messages[{i}]: {exc}; nothing was stored") from None
    with proxy.router.lock(session_id):
        try:
            if not proxy.store.has_session(session_id):  # a refused append creates no session either
                ContextGraph(session_id, batch)
                if body.expected_length not in (None, 0):
                    raise AppendConflict("", None, 0)
                try:
                    proxy.store.create_session(session_id)
                except StoreError:
                    pass  # created concurrently by another instance
            positions = proxy.store.append(session_id, batch, idempotency_key=idempotency_key,
                                           expected_length=body.expected_length)
        except EventError as exc:
            raise HTTPException(400, f"messages: {exc}") from None
        except StoreFullError as exc:  # the store's file is named in the log, not to the client
            log.error("store disk full: append refused", extra={"session": session_id, "error": str(exc)})
            raise HTTPException(507, f"{exc.reason}; nothing of this append was stored, send it again once "
                                     f"there is space (GET /health reports the state)") from None
        except AppendConflict as exc:
            detail = (f"Idempotency-Key: {exc.key!r} was already used in session {session_id!r} with a different body"
                      if exc.key is not None else
                      f"expected_length: session {session_id!r} has {exc.length} events, not {body.expected_length}")
            return JSONResponse({"detail": detail, "length": exc.length}, status_code=409)
    return AppendResponse(positions=positions)


@router.post("/sessions/{session_id}/render", response_model=RenderResponse)
async def render_session(session_id: str, body: RenderRequest, request: Request) -> RenderResponse:
    proxy = _proxy(request)
    session_id = segment(session_id)
    _known(proxy, session_id)
    policy = body.policy or proxy.config.policy
    budget = body.budget or proxy.config.budget
    try:
        check_production(policy)
    except PolicyError as exc:
        raise HTTPException(400, f"policy: {exc}") from None

    def run() -> Any:
        with proxy.router.lock(session_id):
            return proxy.render(session_id, policy, budget), proxy.store.graph(session_id)

    try:
        r, graph = await run_in_threadpool(run)
    except ClientError as exc:
        raise HTTPException(400, str(exc).replace("X-HistoryGraph-Budget", "budget")) from None
    ids = [m.tool_call_id or "" for m in graph.messages]
    return RenderResponse(policy=policy, budget=budget, messages=r.to_openai(), positions=r.positions, selected=r.full,
                          selected_ids=[ids[p] for p in r.full], omitted=r.omitted, omitted_ids=[ids[p] for p in r.omitted],
                          dropped=r.dropped, history_tokens=r.history_tokens, input_tokens=r.input_tokens, reasons=r.reasons)


@router.get("/sessions/{session_id}/omitted", response_model=OmittedResponse)
def read_omitted(session_id: str, request: Request) -> OmittedResponse:
    """What each rendering of the session for a model call left out and why (items by position;
    tokens of the proxy's tokenizer)."""
    proxy = _proxy(request)
    session_id = segment(session_id)
    _known(proxy, session_id)
    with proxy.router.lock(session_id):
        graph = proxy.store.graph(session_id)
        records = proxy.store.omitted(session_id)
    return OmittedResponse(session_id=session_id, reasons=REASONS,
                           calls=[OmittedCall(**c) for c in calls(records, graph, proxy.signals.counter)])


@router.get("/sessions/{session_id}/results/{tool_call_id}", response_model=ToolResultResponse)
def read_result(session_id: str, tool_call_id: str, request: Request) -> ToolResultResponse:
    proxy = _proxy(request)
    session_id, tool_call_id = segment(session_id), segment(tool_call_id)
    _known(proxy, session_id)
    graph = proxy.store.graph(session_id)
    if tool_call_id not in graph.result_of:
        raise HTTPException(404, f"tool_call_id: no stored result {tool_call_id!r} in session {session_id!r}")
    pos = graph.result_of[tool_call_id]
    m = graph.messages[pos]
    return ToolResultResponse(id=tool_call_id, position=pos, name=m.name, content=m.content,
                              media=json.loads(m.media) if m.media else [])
