"""historygraph report: one self-contained HTML page (checked in headless Chromium) and Markdown."""

import json
import re
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from historygraph.cli import app
from historygraph.eval.html_report import ReportError, load_run

runner = CliRunner()
# slow: the module's fixture replays four policies at two budgets and writes the report, and one
# test opens it in headless Chromium: about 4.5 CPU s in all (docs/tests.md)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    res = runner.invoke(app, ["replay", "--policy", "prune", "--policy", "full", "--policy", "cw-sliding-window",
                              "--policy", "oracle", "--budget", "1500,3000", "--store", ":memory:", "--out", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    REPORT_OUTPUT.append(res.output)
    return out


REPORT_OUTPUT: list[str] = []  # what `historygraph report` printed in the fixture


def test_report_says_what_it_is_doing_before_each_figure(run_dir):
    """Drawing the figures takes seconds each (≈ 20 s on the real traces), so the command names each
    step before it runs instead of printing nothing until the end."""
    lines = REPORT_OUTPUT[0].splitlines()
    steps = [ln for ln in lines if ln.endswith(" …")]
    assert steps[0] == f"reading {run_dir / 'replay.json'} …"
    assert [s.split(":")[0] for s in steps[1:]] == [f"drawing figure {i} of 6" for i in range(1, 7)]
    assert steps[-1].startswith("drawing figure 6 of 6: timeline of ")
    assert lines[-1].startswith("wrote ")


def test_report_is_self_contained_html_plus_markdown(run_dir):
    page = (run_dir / "report.html").read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched at view time
    pngs = sorted(p.name for p in (run_dir / "report-files").glob("*.png"))
    # recall vs cost with the cache (issue 37), Figure 4, Table 2, Figure 5 (two budgets ran), cache and cost, one timeline
    assert pngs == ["budget_sweep.png", "cache_and_cost.png", "recall_by_age.png", "recall_vs_cache_cost.png", "recall_vs_cost.png", "timeline.png"]
    assert page.count('src="data:image/png;base64,') == len(pngs)
    md = (run_dir / "report.md").read_text()
    for name in pngs:
        assert f"(report-files/{name})" in md
    assert "| prune |" in md and "cost (Full ρ)" in md and "% of oracle" in md  # the oracle ran and "B = 3000" not in md.split("##")[0].split(";")[0]
    # headline budget: 6000 did not run, so the first one; the other budget's summary tables follow
    # (a sweep's second budget had no table), the per-trace table is the headline budget's
    assert page.index("at B = 1500</h2>") < page.index("at B = 3000</h2>")
    assert "## openai-chat at B = 3000" in md and "Per trace at B = 1500" in page and "Per trace at B = 3000" not in page
    # one source: its ALL rows repeat it, so there is no ALL table (a walkthrough read two identical tables)
    assert "## ALL at B" not in md and "ALL at B" not in page


def test_report_opens_with_the_recommended_policy_per_budget(run_dir):
    """Issue 40: the first screen said nothing about which policy to use. It now opens with the rule
    and one row per budget and price model, before every figure and table. On the example trace at
    B = 1500 prune (recall 56.4) and cw-sliding-window (41.0) cost less than Full with eq. 3's and
    OpenAI's caches and neither with Anthropic's (replay.json of this run: prune 0.88, 0.94, 1.44);
    the oracle, cheaper still, is never recommended. At B = 3000 nothing costs less than Full."""
    md = (run_dir / "report.md").read_text()
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Recommended policy"
    assert "| 1500 | CR-eq3 | prune | 56.4 | 0.882 | – |" in md and "| 1500 | openai-style | prune | 56.4 |" in md
    assert "| 1500 | anthropic-style | full (none cheaper) | 100.0 | 1.000 |" in md
    assert "| 3000 | CR-eq3 | full (none cheaper) |" in md and "oracle |" not in md.split("## ")[1]
    page = (run_dir / "report.html").read_text()
    assert page.index("<h2>") == page.index("<h2>Recommended policy</h2>")  # the first section of the page too


def test_report_errors_name_what_to_run(tmp_path):
    res = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "no such folder" in res.output and "reading" not in res.output  # the error alone
    (tmp_path / "empty").mkdir()  # a folder for a replay to write into: replay there first
    res = runner.invoke(app, ["report", str(tmp_path / "empty")])
    assert res.exit_code == 2 and f"--out {tmp_path / 'empty'}' first" in res.output
    traces = tmp_path / "traces"  # a folder of traces (a user pointed report at their data): replay it elsewhere
    traces.mkdir()
    (traces / "s.jsonl.gz").write_bytes(b"")
    res = runner.invoke(app, ["report", str(traces)])
    assert res.exit_code == 2 and "is not the --out folder of a replay" in res.output
    assert f"historygraph replay {traces} --out replay-results" in " ".join(res.output.split())
    (tmp_path / "replay.json").write_text(json.dumps({"meta": {}, "per_source": [{"policy": "prune", "recall": 1.0}]}))
    with pytest.raises(ReportError, match="older replay"):
        load_run(tmp_path)


def test_report_rejects_a_budget_or_trace_the_run_lacks(run_dir):
    res = runner.invoke(app, ["report", str(run_dir), "--budget", "6000"])
    assert res.exit_code == 2 and "did not run" in res.output and "1500, 3000" in res.output
    res = runner.invoke(app, ["report", str(run_dir), "--trace", "no-such-trace"])
    assert res.exit_code == 2 and "matches 0 traces" in res.output


HARNESS = """<!doctype html><html><body><pre id=out>pending</pre>
<iframe id=f src="report.html" width=1400 height=900></iframe>
<script>
function column(d, key) {
  const t = d.getElementById('per-trace'), idx = [...t.tHead.rows[0].cells].findIndex(c => c.dataset.key === key);
  return [...t.tBodies[0].rows].map(r => r.cells[idx].dataset.v === undefined ? null : parseFloat(r.cells[idx].dataset.v));
}
document.getElementById('f').onload = () => {
  const d = document.getElementById('f').contentDocument;
  const images = [...d.images].map(i => ({complete: i.complete, width: i.naturalWidth}));
  const th = d.querySelector('#per-trace th[data-key=recall]');
  th.click(); const up = column(d, 'recall');
  th.click(); const down = column(d, 'recall');
  const src = d.querySelector('#per-trace th[data-key=policy]'); src.click();
  const names = [...d.getElementById('per-trace').tBodies[0].rows].map(r => r.cells[2].textContent);
  const h2 = d.querySelector('h2'), table = d.querySelector('table');
  const first = {heading: h2.textContent, top: h2.getBoundingClientRect().top,
                 tableTop: table.getBoundingClientRect().top, tableText: table.textContent,
                 tableFollows: !!(h2.compareDocumentPosition(table) & Node.DOCUMENT_POSITION_FOLLOWING)};
  document.getElementById('out').textContent = JSON.stringify({images, up, down, names, first});
};
</script></body></html>"""


def _chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("headless Chromium not installed (Debian: apt-get install chromium; .ci/run installs it)")
    return exe


def test_report_loads_in_headless_chromium_every_image_renders_and_the_table_sorts(run_dir):
    exe = _chromium()
    (run_dir / "harness.html").write_text(HARNESS)
    out = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                          "--virtual-time-budget=20000", "--dump-dom", (run_dir / "harness.html").as_uri()],
                         capture_output=True, text=True, timeout=120)
    m = re.search(r"<pre id=\"out\">(.*?)</pre>", out.stdout, re.DOTALL)
    assert m and m.group(1) != "pending", out.stdout[-2000:] + out.stderr[-2000:]
    got = json.loads(m.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"'))
    assert len(got["images"]) == 6 and all(i["complete"] and i["width"] > 100 for i in got["images"])
    up = [v for v in got["up"] if v is not None]
    assert len(up) >= 3 and up == sorted(up) and [v for v in got["down"] if v is not None] == sorted(up, reverse=True)
    assert got["names"] == sorted(got["names"])
    # issue 40: the first screen (1400×900) opens with the recommendation, whose table is the page's first
    first = got["first"]
    assert first["heading"] == "Recommended policy" and first["tableFollows"] and 0 <= first["top"] < first["tableTop"] < 900
    assert "prune" in first["tableText"] and "anthropic-style" in first["tableText"]
    shot = run_dir / "first-screen.png"  # the test artefact: what a user sees first
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900",
                    f"--screenshot={shot}", (run_dir / "report.html").as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000


def test_report_announces_only_the_figures_it_draws(tmp_path):
    """With one budget there is no budget sweep (Figure 5): the progress said 'drawing figure 3 of
    5: budget_sweep' and wrote no such file."""
    from historygraph.eval.html_report import write_report

    out = tmp_path / "one"
    res = runner.invoke(app, ["replay", "--policy", "prune", "--budget", "1500", "--store", ":memory:", "--out", str(out)])
    assert res.exit_code == 0, res.output
    said: list[str] = []
    write_report(out, progress=said.append)
    drawn = [s for s in said if s.startswith("drawing figure")]
    assert not any("budget_sweep" in s for s in drawn)
    n = len(drawn)
    assert [s.split(":")[0] for s in drawn] == [f"drawing figure {i} of {n}" for i in range(1, n + 1)]
    assert len(list((out / "report-files").glob("*.png"))) == n


def test_a_full_disk_leaves_no_truncated_output_and_the_previous_files(tmp_path, monkeypatch):
    """Issue 38, class 6: the evaluator wrote replay.json, then died on ENOSPC with a traceback and
    an empty timelines.json.gz. Now every file is written under a temporary name and renamed only
    when all were written: a full disk leaves the previous outputs byte for byte, no partial file,
    and the command says "disk full"."""
    import errno
    import gzip as gzip_mod

    from typer.testing import CliRunner

    from historygraph.cli import app
    from historygraph.eval import report as report_mod

    out = tmp_path / "out"
    runner = CliRunner()
    assert runner.invoke(app, ["replay", "-p", "prune", "-b", "3000", "--store", ":memory:", "--out", str(out)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report_mod.gzip, "open", full_disk)
    res = runner.invoke(app, ["replay", "-p", "prune", "-p", "full", "-b", "3000", "--store", ":memory:", "--out", str(out)])
    monkeypatch.setattr(report_mod.gzip, "open", gzip_mod.open)
    assert res.exit_code == 2 and "disk full while writing the replay's outputs" in res.output
    assert "Traceback" not in res.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the previous run's files, nothing partial
