"""The report's figures (matplotlib, Agg backend), each returned as PNG bytes.

Every figure states the budget B and the trace set in its title. Policies keep one colour and one
marker across all figures (:func:`styles`): 20 colours × 7 markers keep 25 policies and more
distinguishable, also in greyscale (markers differ before colours repeat).
"""

from __future__ import annotations

import io
from typing import Any, Sequence

import numpy as np

from historygraph.eval.recall import AGE_BINS
from historygraph.eval.prices import label
from historygraph.eval.recorded import RECORDED

OWN_LABEL = "the agent's own (recorded)"

MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", "-.", ":")
FORM_COLOURS = {"F": "#2b8a3e", "E": "#fab005", "S": "#4dabf7", "P": "#adb5bd", "D": "#f03e3e", "X": "#212529"}
FORM_NAMES = {"F": "full", "E": "excerpt", "S": "summary", "P": "placeholder", "D": "dropped / not shown", "X": "budget error"}


def _plt():  # noqa: ANN202
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - matplotlib is in the test extra
        raise RuntimeError("the report needs matplotlib: pip install -e '.[plots]' in the historygraph clone") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def styles(policies: Sequence[str]) -> dict[str, dict[str, Any]]:
    """policy -> ``{"color", "marker", "linestyle"}``, stable for a given policy order."""
    plt = _plt()
    cmap = plt.get_cmap("tab20")
    out = {}
    for i, p in enumerate(policies):
        c = (i * 2) % 20 + (i // 10) % 2  # dark shades first, then the light ones
        out[p] = {"color": cmap(c), "marker": MARKERS[i % len(MARKERS)], "linestyle": LINESTYLES[(i // 7) % len(LINESTYLES)]}
    return out


def _png(fig) -> bytes:  # noqa: ANN001
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    _plt().close(fig)
    return buf.getvalue()


def _legend(fig, axes, n: int) -> None:  # noqa: ANN001
    handles, names = axes[0].get_legend_handles_labels()
    ncol = min(max(1, len(names)), 5)
    fig.legend(handles, names, loc="lower center", ncols=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.035 * ((len(names) - 1) // ncol + 1), 1, 0.95))


def _panels(n: int, width: float = 4.2, height: float = 3.4):  # noqa: ANN202
    plt = _plt()
    ncols = min(3, max(1, n))
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows + 1.2), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def recall_vs_cache_cost(rows: list[dict[str, Any]], policies: Sequence[str], models: Sequence[str], title: str) -> bytes | None:
    """The plot that decides: Later-Used Result Recall against the cost with each price model's
    prompt cache (``cost_cache_M``, Full history = 1; :mod:`.cache_cost`), one panel per price model,
    on the ``ALL`` rows. Left of 1 a policy lowers the bill; higher, it shows more of what is reused.
    A ``recorded`` entry of ``policies`` (session logs) is the agent's own context management, drawn
    as a black star. ``None`` when no such cost was measured."""
    rows = [r for r in rows if r.get("source") == "ALL"]
    models = [m for m in models if any(r.get(f"cost_cache_{m}") is not None for r in rows)]
    if not models:
        return None
    st = styles(policies)
    fig, axes = _panels(len(models))
    for ax, m in zip(axes, models):
        n = 0
        for p in policies:
            r = next((x for x in rows if x["policy"] == p), None)
            if r is None or r.get(f"cost_cache_{m}") is None or r.get("recall") is None:
                continue
            n = r.get("cost_traces") or n
            s = {"marker": "*", "color": "black"} if p == RECORDED else st[p]
            ax.plot([r[f"cost_cache_{m}"]], [r["recall"]], linestyle="none", marker=s["marker"], color=s["color"],
                    label=OWN_LABEL if p == RECORDED else p, ms=11 if p == RECORDED else 8)
        ax.set_title(f"{label(m)} ({n} trace{'' if n == 1 else 's'} with Full history > B)", fontsize=9)
        ax.set_xlabel("cost with the prompt cache (Full history = 1)", fontsize=8)
        ax.set_ylabel("Later-Used Result Recall (%)", fontsize=8)
        ax.axvline(1.0, color="#999", lw=0.5)
        ax.grid(alpha=0.3)
    fig.suptitle(title + "\neach panel: one provider's price model and simulated prompt cache (docs/evaluator.md, Price models); "
                 "left of the line a policy costs less than sending Full history", fontsize=9)
    _legend(fig, axes, len(policies))
    return _png(fig)


def recall_vs_cost(rows: list[dict[str, Any]], policies: Sequence[str], title: str) -> bytes | None:
    """ContextRender Figure 4: Later-Used Result Recall against normalised cost (Full history = 1),
    one panel per source; filled markers price with Full history's ρ (C.2), hollow ones with the
    policy's own measured prefix reuse, joined by a thin line. ``None`` when no cost was measured."""
    sources = [s for s in dict.fromkeys(r["source"] for r in rows)
               if any(r["source"] == s and r.get("norm_cost") is not None for r in rows)]
    if not sources:
        return None
    st = styles(policies)
    fig, axes = _panels(len(sources))
    for ax, src in zip(axes, sources):
        n = 0
        for p in policies:
            r = next((x for x in rows if x["source"] == src and x["policy"] == p), None)
            if r is None or r.get("norm_cost") is None or r.get("recall") is None:
                continue
            n = r.get("cost_traces") or n
            s = st[p]
            ax.plot([r["norm_cost"]], [r["recall"]], linestyle="none", marker=s["marker"], color=s["color"], label=p, ms=7)
            if r.get("norm_cost_own") is not None:
                ax.plot([r["norm_cost"], r["norm_cost_own"]], [r["recall"]] * 2, color=s["color"], lw=0.6)
                ax.plot([r["norm_cost_own"]], [r["recall"]], linestyle="none", marker=s["marker"], ms=7,
                        markerfacecolor="none", markeredgecolor=s["color"])
        ax.set_title(f"{src} ({n} trace{'' if n == 1 else 's'} with Full history > B)", fontsize=9)
        ax.set_xlabel("normalised inference cost (Full history = 1)", fontsize=8)
        ax.set_ylabel("Later-Used Result Recall (%)", fontsize=8)
        ax.axvline(1.0, color="#999", lw=0.5)
        ax.grid(alpha=0.3)
    fig.suptitle(title + "\nfilled: priced with Full history's cache fraction (ContextRender C.2); hollow: with the policy's own prefix reuse",
                 fontsize=9)
    _legend(fig, axes, len(policies))
    return _png(fig)


def recall_by_age(rows: list[dict[str, Any]], policies: Sequence[str], title: str) -> bytes | None:
    """ContextRender Table 2 as bars: recall by result age (turns), one panel per source."""
    sources = list(dict.fromkeys(r["source"] for r in rows))
    if not sources:
        return None
    st = styles(policies)
    fig, axes = _panels(len(sources), width=4.6)
    width = 0.8 / max(1, len(policies))
    for ax, src in zip(axes, sources):
        first = next(x for x in rows if x["source"] == src)
        for i, p in enumerate(policies):
            r = next((x for x in rows if x["source"] == src and x["policy"] == p), None)
            if r is None:
                continue
            vals = [r[f"recall_age_{b}"] or 0.0 for b in AGE_BINS]
            ax.bar(np.arange(len(AGE_BINS)) + i * width, vals, width, color=st[p]["color"], label=p)
        ax.set_xticks(np.arange(len(AGE_BINS)) + width * (len(policies) - 1) / 2,
                      [f"{b}\nn={first[f'events_age_{b}']}" for b in AGE_BINS], fontsize=7)
        ax.set_title(src, fontsize=9)
        ax.set_xlabel("result age (turns: model calls)", fontsize=8)
        ax.set_ylabel("recall (%)", fontsize=8)
    fig.suptitle(title, fontsize=9)
    _legend(fig, axes, len(policies))
    return _png(fig)


def budget_sweep(rows: list[dict[str, Any]], policies: Sequence[str], title: str) -> bytes | None:
    """ContextRender Figure 5: recall, mean history tokens and normalised cost against B (``ALL``
    rows of every budget); ``None`` with fewer than two budgets."""
    budgets = sorted({r["budget"] for r in rows if r["budget"] is not None})
    if len(budgets) < 2:
        return None
    st = styles(policies)
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.4))
    for p in policies:
        pts = sorted((r["budget"], r) for r in rows if r["policy"] == p and r["source"] == "ALL")
        xs = [b for b, _ in pts]
        s = st[p]
        kw = dict(color=s["color"], marker=s["marker"], linestyle=s["linestyle"], ms=5, label=p)
        axes[0].plot(xs, [r["recall"] for _, r in pts], **kw)
        axes[1].plot(xs, [r["mean_history_tokens"] for _, r in pts], **kw)
        axes[2].plot(xs, [r.get("norm_cost") for _, r in pts], **kw)
    for ax, lab in zip(axes, ("Later-Used Result Recall (%)", "mean rendered history tokens", "cost by ContextRender eq. 3, no prompt cache\nsimulated (Full = 1; the tables price each cache)")):
        ax.set_xlabel("history budget B (tokens)", fontsize=8)
        ax.set_ylabel(lab, fontsize=8)
        ax.set_xticks(budgets, [str(b) for b in budgets], fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    _legend(fig, list(axes), len(policies))
    return _png(fig)


def cache_and_cost(rows: list[dict[str, Any]], policies: Sequence[str], title: str) -> bytes | None:
    """Per policy (``ALL`` rows): measured prefix-cache reuse, and normalised cost priced with Full
    history's ρ and with the policy's own."""
    rs = [next((r for r in rows if r["policy"] == p and r["source"] == "ALL"), None) for p in policies]
    pairs = [(p, r) for p, r in zip(policies, rs) if r is not None and r.get("prefix_reuse_pct") is not None]
    if not pairs:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.32 * len(pairs) + 1.8), sharey=True)
    y = np.arange(len(pairs))
    names = [p for p, _ in pairs]
    axes[0].barh(y, [r["prefix_reuse_pct"] for _, r in pairs], color="#4c6ef5")
    axes[0].set_xlabel("prompt tokens a prefix cache can serve (%)", fontsize=8)
    axes[0].set_xlim(0, 100)
    full = [r.get("norm_cost") or 0 for _, r in pairs]
    own = [r.get("norm_cost_own") or 0 for _, r in pairs]
    axes[1].barh(y - 0.2, full, 0.4, color="#868e96", label="ρ of Full history (C.2)")
    axes[1].barh(y + 0.2, own, 0.4, color="#f76707", label="own measured ρ")
    axes[1].axvline(1.0, color="#333", lw=0.6)
    axes[1].set_xlabel("normalised cost (Full history = 1)", fontsize=8)
    axes[1].legend(fontsize=7, loc="lower right")
    axes[0].set_yticks(y, names, fontsize=7)
    axes[0].invert_yaxis()
    for ax in axes:
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return _png(fig)


def timeline(tl: dict[str, Any], policies: Sequence[str], title: str) -> bytes | None:
    """One trace: for each policy a grid with a row per stored tool result and a column per
    invocation, coloured by the form the result was shown in; black dots mark B.4 reuse events
    (the result was reused by that invocation's turn)."""
    pols = [p for p in policies if p in tl["forms"]]
    n_res, n_inv = len(tl["results"]), len(tl["invocations"])
    if not pols or not n_res or not n_inv:
        return None
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    letters = list(FORM_COLOURS)
    cmap = ListedColormap([FORM_COLOURS[k] for k in letters])
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    h = min(2.0, max(0.9, 0.03 * n_res + 0.5))
    fig, axes = plt.subplots(len(pols), 1, figsize=(max(7.0, 0.07 * n_inv + 3), h * len(pols) + 1.4), squeeze=False)
    ev = np.array(tl["events"], dtype=float).reshape(-1, 2)
    for ax, p in zip(axes[:, 0], pols):
        grid = np.full((n_res, n_inv), np.nan)
        for k, forms in enumerate(tl["forms"][p]):
            for i, c in enumerate(forms):
                grid[i, k] = letters.index(c)
        ax.imshow(np.ma.masked_invalid(grid), aspect="auto", interpolation="nearest", cmap=cmap,
                  vmin=-0.5, vmax=len(letters) - 0.5)
        if len(ev):
            ax.plot(ev[:, 0], ev[:, 1], linestyle="none", marker="o", ms=3, markerfacecolor="white",
                    markeredgecolor="black", markeredgewidth=0.6)
        ax.set_ylabel(p, fontsize=7, rotation=0, ha="right", va="center")
        ax.set_yticks([])
        ax.tick_params(axis="x", labelsize=6)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1, 0].set_xlabel("invocation (model call) →; rows: stored tool results, oldest on top", fontsize=8)
    handles = [Patch(color=FORM_COLOURS[k], label=FORM_NAMES[k]) for k in letters] + \
        [plt.Line2D([], [], linestyle="none", marker="o", ms=4, markerfacecolor="white", markeredgecolor="black",
                    label="reuse event (B.4)")]
    fig.legend(handles=handles, loc="lower center", ncols=4, fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.6 / fig.get_figheight(), 1, 1 - 0.45 / fig.get_figheight()))
    return _png(fig)
