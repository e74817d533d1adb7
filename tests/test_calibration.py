"""Token calibration against provider-reported usage; values by hand."""

import json

from historygraph.events import Message
from historygraph.signals.calibration import REPLY_PRIMING, TokenCalibration
from historygraph.signals.tokens import TokenCounter


def test_estimate_counts_messages_tools_and_priming():
    c = TokenCounter()
    cal = TokenCalibration(c)
    msgs = [Message("system", "be brief"), Message("user", "hello world")]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    expected = c.count_message(msgs[0]) + c.count_message(msgs[1]) + REPLY_PRIMING + \
        c.count(json.dumps(tools, separators=(",", ":")))
    assert cal.estimate_request(msgs, tools) == expected


def test_ratio_and_adjusted_budget():
    cal = TokenCalibration(TokenCounter())
    assert cal.ratio == 1.0 and cal.adjusted_budget(6000) == 6000
    for est, rep in [(100, 110), (200, 240), (100, 105)]:  # ratios 1.10, 1.20, 1.05 -> median 1.10
        cal.observe(est, rep)
    assert abs(cal.ratio - 1.10) < 1e-9
    assert cal.adjusted_budget(6000) == 5454  # floor(6000 / 1.1)
    assert cal.summary() == {"observations": 3, "median_ratio": 1.1, "max_abs_error": 40}
    cal2 = TokenCalibration(TokenCounter())
    cal2.observe(100, 80)  # provider counts fewer: the budget is never grown
    assert cal2.adjusted_budget(6000) == 6000
