"""Leave-one-agent-out recall of the learned selector across agent families (issue 48).

Agent families: the folders of ``../shared/traces-train`` and ``../shared/traces`` (a folder in both
is one family; mini-swe-agent, OpenHands, SWE-agent, τ-bench, τ²-bench) and of
``../shared/sessions`` (Claude Code, Codex CLI). For each family F the shipped recipe
(``historygraph fit``'s blend) is fitted on the other families' trajectories and ``learned`` with
that model is replayed on F's trajectories, at the budgets the docs use for F (research traces
6000 / 3000, session logs 32000 / 16000), with :func:`historygraph.eval.replay.replay_trace`, so
every figure is Later-Used Result Recall (ContextRender B.4) as ``historygraph replay`` gives it.

``--variant neutral`` computes the features with the agent-neutral facts of ``bench/agent_facts.py``
(every mode: with ``baseline`` the shipped model is scored on them). ``--mode baseline`` scores the tree's own shipped model and ``oracle`` (the exact bound) on the
same trajectories; run it with another tree's sources first on ``PYTHONPATH`` to measure that
tree's model the same way. ``--mode loao`` writes the held-out figures; ``--mode within`` (for
the session families) scores each half of a family's trajectories (even / odd in file order) with a
model fitted on the other families and the other half, the case of a user who fits on their own
sessions; ``--mode all`` fits one
model on every family (the candidate to ship) and writes it to ``--model-out``. ``--table A B``
prints the Markdown table of a baseline and a LOAO run.

Bounded for a shared 2-core machine: at most ``--cap`` trajectories per family are fitted on and at
most ``--test-cap`` scored (every k-th, in file order); feature rows are cached under ``--cache``
(:class:`fit_loso.Rows`).

    python bench/fit_loao.py --mode baseline --out /tmp/base.json
    python bench/fit_loao.py --mode loao --out /tmp/loao.json
    python bench/fit_loao.py --table /tmp/base.json /tmp/loao.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fit_loso import Rows, every, fit, learned_with, score  # noqa: E402

from historygraph.history.events import Trace  # noqa: E402
from historygraph.policies import Signals, create  # noqa: E402
from historygraph.traces import read_traces  # noqa: E402

TRACES, TRAIN, SESSIONS = "../shared/traces", "../shared/traces-train", "../shared/sessions"
RESEARCH_BUDGETS, SESSION_BUDGETS = (6000, 3000), (32000, 16000)


def _read(folder: Path) -> list[Trace]:
    return [t for f in sorted(folder.rglob("*")) if f.is_file() and not f.name.endswith(".md") for t in read_traces(f)]


def families(cap: int, test_cap: int) -> dict[str, dict]:
    """family -> {"fit": trajectories to fit on, "test": trajectories to score, "budgets": (B, B)}.
    mini-swe-agent is fitted on its ``traces-train`` trajectories alone, so its ``../shared/traces``
    ones stay unseen by every model (as by the shipped one); the other research families are fitted
    on the trajectories they are scored on (which matters only for ``--mode all``)."""
    out: dict[str, dict] = {}
    for root in (TRAIN, TRACES):
        for d in sorted(p for p in Path(root).iterdir() if p.is_dir()):
            fam = out.setdefault(d.name, {"all": [], "test": [], "budgets": RESEARCH_BUDGETS})
            ts = _read(d)
            if root == TRAIN or not fam["all"]:  # a family with training trajectories is fitted on them alone
                fam["all"] = ts
            if root == TRACES:
                fam["test"] = ts
    for d in sorted(p for p in Path(SESSIONS).iterdir() if p.is_dir()):
        ts = _read(d)
        out[d.name] = {"all": ts, "test": ts, "budgets": SESSION_BUDGETS}
    for fam in out.values():
        fam["fit"] = every(fam.pop("all"), cap)
        fam["test"] = every(fam["test"], test_cap)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("baseline", "loao", "within", "all"))
    ap.add_argument("--only", default="", help="families to score (comma-separated; default all)")
    ap.add_argument("--cap", type=int, default=20, help="at most N trajectories per family to fit on (0: all)")
    ap.add_argument("--fit-from", default="", help="families to fit on (comma-separated; default all)")
    ap.add_argument("--test-cap", type=int, default=0)
    ap.add_argument("--no-oracle", action="store_true", help="--mode baseline: the shipped model alone")
    ap.add_argument("--out", default="")
    ap.add_argument("--model-out", default="")
    ap.add_argument("--variant", default="shipped", choices=("shipped", "neutral"),
                    help="the facts: the package's, or bench/agent_facts.py's agent-neutral ones")
    ap.add_argument("--cache", default="/tmp/historygraph-loao-rows")
    ap.add_argument("--table", nargs=2, metavar=("BASELINE", "LOAO"))
    a = ap.parse_args()
    if a.table:
        return print(table(json.loads(Path(a.table[0]).read_text()), json.loads(Path(a.table[1]).read_text())))
    t0 = time.process_time()
    fams = families(a.cap, a.test_cap)
    signals = Signals()
    print("; ".join(f"{n}: fit {len(f['fit'])}, score {len(f['test'])}" for n, f in fams.items()), file=sys.stderr)
    only = a.only.split(",") if a.only else list(fams)
    variant = "shipped"
    if a.variant == "neutral":
        import agent_facts

        agent_facts.use()
        variant = "neutral-" + hashlib.sha256(Path(agent_facts.__file__).read_bytes()).hexdigest()[:12]
    out: dict[str, dict] = {}
    if a.mode == "baseline":
        for n in only:
            pols = {"shipped": learned_with(None)} | ({} if a.no_oracle else {"oracle": lambda: create("oracle", replay=True)})
            res = score(fams[n]["test"], pols, list(fams[n]["budgets"]), signals)
            out[n] = {f"{p} {b}": v for (p, b), v in res.items()}
            print(n, out[n], f"({time.process_time() - t0:.0f} s CPU)", file=sys.stderr, flush=True)
    else:
        rows = Rows(Path(a.cache), signals, variant)
        fit_rows = {}
        g = 0
        for n, f in fams.items():
            fit_rows[n] = []
            if a.fit_from and n not in a.fit_from.split(","):
                continue
            for tr in f["fit"]:
                fit_rows[n].append(rows(tr, g))
                g += 1
        print(f"features: {time.process_time() - t0:.0f} s CPU", file=sys.stderr, flush=True)
        if a.mode == "all":
            model = fit([e for es in fit_rows.values() for e in es])
            model.save(a.model_out)
            return print(f"wrote {a.model_out} ({time.process_time() - t0:.0f} s CPU)", file=sys.stderr)
        for n in only:
            others = [e for o, es in fit_rows.items() if o != n for e in es]
            if a.mode == "loao":
                res = score(fams[n]["test"], {"loao": learned_with(fit(others))}, list(fams[n]["budgets"]), signals)
            else:  # within: two folds of the family's own trajectories, the other half added to the other families'
                test = fams[n]["test"]
                res = {}
                for h in (0, 1):
                    own = [rows(tr, g + i) for i, tr in enumerate(test) if i % 2 != h]
                    part = score([tr for i, tr in enumerate(test) if i % 2 == h],
                                 {"loao": learned_with(fit(others + own))}, list(fams[n]["budgets"]), signals)
                    for k, v in part.items():
                        res[k] = [x + y for x, y in zip(res.get(k, [0, 0, 0, 0]), v)]
            out[n] = {f"{p} {b}": v for (p, b), v in res.items()}
            print(n, out[n], f"({time.process_time() - t0:.0f} s CPU)", file=sys.stderr, flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"CPU {time.process_time() - t0:.0f} s", file=sys.stderr)


def table(base: dict, loao: dict) -> str:
    """Markdown: family, B, events, LOAO and today's shipped recall (hits), the exact bound, and
    both as % of the bound."""
    lines = ["| family (scored) | B | events | LOAO | shipped | exact bound | LOAO / bound | shipped / bound |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for n, res in loao.items():
        for key in (k for k in res if k.startswith("loao ")):  # (session logs also get the agent's own row)
            b = key.split()[1]
            lo, sh, orc = res[key], base[n][f"shipped {b}"], base[n][f"oracle {b}"]
            r = [100.0 * x[0] / max(1, x[1]) for x in (lo, sh, orc)]
            lines.append(f"| {n} | {b} | {lo[1]} | {r[0]:.1f} ({lo[0]}) | {r[1]:.1f} ({sh[0]}) | {r[2]:.1f} | "
                         f"{100 * r[0] / max(r[2], 1e-9):.0f} % | {100 * r[1] / max(r[2], 1e-9):.0f} % |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
