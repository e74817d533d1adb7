"""Read the per-worker traces that ``split.py`` writes with ``HG_TRACE=DIR``: stage times (ms) of the
last N proxied requests (default 1,000: the paced phase of 50 sessions × 20 requests), SQLite lock
waits and event-loop lag. Usage: ``python bench/proxy_trace/analyze.py DIR [N]`` (``PID=…``: one worker)."""
# ruff: noqa: E401, E402, E701, E702  (a diagnostic script, kept compact)
import json, glob, sys, statistics as st
d = sys.argv[1]; n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
recs = []
for f in glob.glob(f"{d}/trace-*.jsonl"):
    pid = f.split("-")[-1].split(".")[0]
    for line in open(f, errors="ignore"):
        r = json.loads(line); r["pid"] = pid; recs.append(r)
recs.sort(key=lambda r: r["t0"])
paced = recs[-n:]
import os
if os.environ.get("PID"): paced = [r for r in paced if r["pid"] == os.environ["PID"]]
def pct(xs, q):
    xs = sorted(xs); return xs[min(len(xs)-1, int(round(q*(len(xs)-1))))]
def show(name, xs):
    xs = [x*1000 for x in xs]
    print(f"{name:28s} p50 {pct(xs,.5):7.2f} p95 {pct(xs,.95):7.2f} mean {st.mean(xs):7.2f}")
from collections import Counter
print("per worker", Counter(r["pid"] for r in paced))
show("total (arrival->end)", [r["t_end"]-r["t0"] for r in paced])
p0 = [r["pool"][0] for r in paced]
show("arrival->prepare submit", [e["sub"]-r["t0"] for e, r in zip(p0, paced)])
show("prepare queue wait", [e["start"]-e["sub"] for e in p0])
show("prepare wall", [e["end"]-e["start"] for e in p0])
show("prepare cpu", [e["cpu"] for e in p0])
show("prepare back (loop resume)", [e["back"]-e["end"] for e in p0])
show("back->upstream send", [r["up"][0]-e["back"] for e, r in zip(p0, paced)])
show("upstream", [r["up"][1]-r["up"][0] for r in paced])
p1 = [r["pool"][1] for r in paced if len(r["pool"]) > 1]
show("upstream end->store submit", [r["pool"][1]["sub"]-r["up"][1] for r in paced if len(r["pool"])>1])
show("store queue wait", [e["start"]-e["sub"] for e in p1])
show("store wall", [e["end"]-e["start"] for e in p1])
show("store cpu", [e["cpu"] for e in p1])
show("store back", [e["back"]-e["end"] for e in p1])
show("store back->resp start", [r["t_resp"]-r["pool"][1]["back"] for r in paced if len(r["pool"])>1])
show("resp start->end", [r["t_end"]-r["t_resp"] for r in paced])
t0, t1 = paced[0]["t0"], paced[-1]["t_end"]
w = []
for f in glob.glob(f"{d}/sqlite-*.jsonl"):
    for line in open(f, errors="ignore"):
        try: x = json.loads(line)
        except ValueError: continue
        if t0 <= x[0] <= t1: w.append(x)
if w:
    show("sqlite py-lock wait", [x[1] for x in w]); show("sqlite BEGIN IMMEDIATE", [x[2] for x in w])
    show("sqlite body", [x[3] for x in w]); show("sqlite COMMIT", [x[4] for x in w])
for f in glob.glob(f"{d}/lag-*.txt"):
    lags = [float(l.split()[1]) for l in open(f, errors="ignore") if l.strip() and t0 <= float(l.split()[0]) <= t1]
    if lags: print(f, "loop lag ms p50 %.2f p95 %.2f p99 %.2f max %.1f n %d" % (pct(lags,.5), pct(lags,.95), pct(lags,.99), max(lags), len(lags)))
