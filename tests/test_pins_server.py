"""Pins (issue 40) through the server: the session API's pin endpoints and the proxy's
X-HistoryGraph-Pin header, against the rule-enforcing fake provider (tests/fake_upstream.py)."""

from __future__ import annotations

import httpx
import pytest

from test_server import KEY, TOOLS, WORDS, api, history, history_tokens, oai, received, servers  # noqa: F401 (fixture)

WIDE = 1200  # three results of ~400 tokens do not fit, two do (Prune keeps the two newest without a pin)


def results_of(msgs: list[dict]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in msgs if m["role"] == "tool"}


def test_session_api_pins_an_old_result_lists_it_and_unpins_it(servers):  # noqa: F811 (the fixture)
    msgs = history("pa", n=3)
    assert api(servers, "POST", "/sessions/pa/events", json={"messages": msgs, "create": True}).status_code == 200
    before = api(servers, "POST", "/sessions/pa/render", json={"budget": WIDE}).json()
    assert before["selected_ids"] == ["pac1", "pac2"] and before["omitted_ids"] == ["pac0"]
    r = api(servers, "POST", "/sessions/pa/pins", json={"id": "pac0"})
    assert r.status_code == 200 and r.json() == {"pins": [{"id": "pac0", "position": 3}]}
    assert api(servers, "POST", "/sessions/pa/pins", json={"id": "#1"}).json()["pins"] == [
        {"id": "#1", "position": 1}, {"id": "pac0", "position": 3}]
    assert api(servers, "GET", "/sessions/pa").json()["pins"] == [{"id": "#1", "position": 1}, {"id": "pac0", "position": 3}]
    r = api(servers, "POST", "/sessions/pa/render", json={"budget": WIDE}).json()
    assert sorted(r["selected_ids"]) == ["pac0", "pac2"] and r["omitted_ids"] == ["pac1"]
    assert results_of(r["messages"])["pac0"] == "result0 " * WORDS and r["history_tokens"] <= WIDE
    too_small = api(servers, "POST", "/sessions/pa/render", json={"budget": 300})  # pac0 alone is ~400 tokens
    assert too_small.status_code == 400 and "pinned items #1, pac0" in too_small.json()["detail"]
    for body, status, detail in (({"id": "nope"}, 404, "id: no item 'nope'"), ({"id": 99}, 404, "holds messages #0–#8"),
                                 ({"item": "pac0"}, 422, None)):
        r = api(servers, "POST", "/sessions/pa/pins", json=body)
        assert r.status_code == status and (detail is None or detail in r.json()["detail"])
    assert api(servers, "POST", "/sessions/no-such/pins", json={"id": "pac0"}).status_code == 404
    assert api(servers, "DELETE", "/sessions/pa/pins/%231").json()["pins"] == [{"id": "pac0", "position": 3}]
    assert api(servers, "DELETE", "/sessions/pa/pins/pac0").json()["pins"] == []
    assert api(servers, "POST", "/sessions/pa/render", json={"budget": WIDE}).json()["omitted_ids"] == ["pac0"]
    paths = httpx.get(servers["px"] + "/openapi.json").json()["paths"]
    assert {"/api/sessions/{session_id}/pins", "/api/sessions/{session_id}/pins/{item}"} <= set(paths)


def test_pin_header_pins_for_this_and_later_requests(servers):  # noqa: F811 (the fixture)
    msgs = history("ph", n=3)
    client = oai(servers, "ph", **{"X-HistoryGraph-Pin": "phc0", "X-HistoryGraph-Budget": str(WIDE)})
    client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
    sent = received(servers)["body"]["messages"]
    assert results_of(sent)["phc0"] == "result0 " * WORDS and results_of(sent)["phc2"] == "result2 " * WORDS
    assert "result1 " * WORDS not in results_of(sent).values() and history_tokens(sent) <= WIDE
    assert api(servers, "GET", "/sessions/ph").json()["pins"] == [{"id": "phc0", "position": 3}]
    # a later request without the header: the pin holds
    answer = api(servers, "GET", "/sessions/ph").json()["messages"][-1]
    later = msgs + [{"role": "assistant", "content": answer["content"], "tool_calls": answer["tool_calls"]},
                    {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "more " * 50}]
    oai(servers, "ph", **{"X-HistoryGraph-Budget": str(WIDE)}).chat.completions.create(model="m", messages=later, tools=TOOLS)
    assert results_of(received(servers)["body"]["messages"])["phc0"] == "result0 " * WORDS


def test_pins_over_the_budget_are_forwarded_as_the_smallest_valid_request(servers):  # noqa: F811 (the fixture)
    msgs = history("po", n=3)
    r = httpx.post(servers["px"] + "/v1/chat/completions", json={"model": "m", "messages": msgs, "tools": TOOLS},
                   headers={"Authorization": f"Bearer {KEY}", "X-HistoryGraph-Session": "po",
                            "X-HistoryGraph-Pin": "poc0, poc1", "X-HistoryGraph-Budget": "500"})
    assert r.status_code == 200  # the fake provider accepted it
    sent = received(servers)["body"]["messages"]
    shown = results_of(sent)
    assert shown["poc0"] == "result0 " * WORDS and shown["poc1"] == "result1 " * WORDS  # the pins, whole
    assert "poc2" in shown["poc2"] and shown["poc2"] != "result2 " * WORDS  # the newest: as small as valid, an excerpt naming it
    assert int(r.headers["x-historygraph-over-budget"]) == history_tokens(sent) > 500


def test_an_unknown_id_in_the_pin_header_is_a_400_and_stores_nothing(servers):  # noqa: F811 (the fixture)
    """Issue 50: a request refused for its X-HistoryGraph-Pin header had already stored its
    messages, so the client's edited retry forked the session. The header is checked first."""
    import openai

    msgs = history("pu")
    with pytest.raises(openai.BadRequestError, match=r"X-HistoryGraph-Pin: no item 'ghost'") as exc:
        oai(servers, "pu", **{"X-HistoryGraph-Pin": "puc0,ghost"}).chat.completions.create(model="m", messages=msgs)
    assert exc.value.body["param"] == "X-HistoryGraph-Pin"
    assert api(servers, "GET", "/sessions/pu").status_code == 404  # nothing stored, not even the session
    edited = msgs[:-1] + [{"role": "user", "content": "and then?"}]  # the client edits its request and retries
    oai(servers, "pu", **{"X-HistoryGraph-Pin": "puc0"}).chat.completions.create(model="m", messages=edited)
    stored = api(servers, "GET", "/sessions/pu").json()
    assert stored["messages"][len(msgs) - 1]["content"] == "and then?" and stored["pins"] == [{"id": "puc0", "position": 3}]
    assert [s["id"] for s in api(servers, "GET", "/sessions").json() if s["id"].startswith("pu~")] == []  # no fork
    # a session already stored: the refused request appends nothing to it
    more = stored["messages"] + [{"role": "user", "content": "one more"}]
    with pytest.raises(openai.BadRequestError, match=r"X-HistoryGraph-Pin: no item '#99'"):
        oai(servers, "pu", **{"X-HistoryGraph-Pin": "#99"}).chat.completions.create(model="m", messages=more)
    assert len(api(servers, "GET", "/sessions/pu").json()["messages"]) == len(stored["messages"])


def test_a_pin_id_that_is_not_a_string_or_an_integer_is_a_422(servers):  # noqa: F811 (the fixture)
    """Issue 50: ``{"id": true}`` pinned message #1 (pydantic's lax ``str | int`` read true as 1)."""
    assert api(servers, "POST", "/sessions/pt/events", json={"messages": history("pt", n=1), "create": True}).status_code == 200
    for bad in (True, False, 1.5, 1.0, None, ["#1"], {"id": "#1"}):
        r = api(servers, "POST", "/sessions/pt/pins", json={"id": bad})
        assert r.status_code == 422, (bad, r.text)
    assert api(servers, "GET", "/sessions/pt").json()["pins"] == []
    assert api(servers, "POST", "/sessions/pt/pins", json={"id": 1}).json()["pins"] == [{"id": "#1", "position": 1}]


def test_unpinning_an_item_that_is_not_pinned_is_a_404_naming_it(servers):  # noqa: F811 (the fixture)
    """Issue 50: deleting a pin never set answered 200 as if it had been removed."""
    assert api(servers, "POST", "/sessions/pn/events", json={"messages": history("pn", n=2), "create": True}).status_code == 200
    assert api(servers, "POST", "/sessions/pn/pins", json={"id": "pnc0"}).status_code == 200
    r = api(servers, "DELETE", "/sessions/pn/pins/pnc1")
    assert r.status_code == 404 and r.json()["detail"] == "item: 'pnc1' (message #5) is not pinned in session 'pn'; its pins: pnc0"
    r = api(servers, "DELETE", "/sessions/pn/pins/%231")
    assert r.status_code == 404 and "'#1' (message #1) is not pinned" in r.json()["detail"]
    r = api(servers, "DELETE", "/sessions/pn/pins/ghost")
    assert r.status_code == 404 and "item: no item 'ghost'" in r.json()["detail"]
    assert api(servers, "GET", "/sessions/pn").json()["pins"] == [{"id": "pnc0", "position": 3}]  # unchanged
    assert api(servers, "DELETE", "/sessions/pn/pins/pnc0").json()["pins"] == []
    assert api(servers, "DELETE", "/sessions/pn/pins/pnc0").status_code == 404  # not pinned any more
