"""Progress of the long commands (replay, fit) on stderr: rich's live bar on a terminal, plain
lines at most every :data:`PLAIN_PROGRESS_SECONDS` and at least every :data:`HEARTBEAT_SECONDS`
elsewhere (a log file, CI), and the time left weighted by each trajectory's work."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Iterator

from rich.progress import Progress, ProgressColumn, Task, TaskID
from rich.text import Text

from historygraph.cli.common import err

PLAIN_PROGRESS_SECONDS = 10.0  # when stderr is not a terminal, a progress line at most this often
HEARTBEAT_SECONDS = 30.0       # ... and at least this often, while a long trajectory is being worked on
_last_line: dict[int, float] = {}
_work: dict[int, tuple[list[float], dict]] = {}  # task -> (work per trajectory, the dict of those finished)
_finished_at: dict[int, float] = {}  # task -> its elapsed seconds when a trajectory last finished (advance)


def _time_left(t: Task) -> float | None:
    """Seconds left for task ``t``: the time until the last trajectory finished per unit of work
    finished, times the work left, less the time spent since then on the trajectories in progress
    (but never below the time of the work left without the largest unfinished trajectory, nor
    below 0: a long one in progress makes the estimate fall, not grow). The work of a trajectory
    is what the task registered in :data:`_work` (for replay :func:`_replay_work`: trajectories
    differ in cost by 1,000×, so a count of them misleads), else its count (rich's own estimate
    counts trajectories, and lapses when nothing finishes for half a minute). ``None`` before
    anything finished and once all did."""
    weights, finished = _work.get(t.id, ([], {}))
    done_w = sum(weights[i] for i in finished) if weights else t.completed
    total_w = sum(weights) if weights else (t.total or 0)
    if not done_w or not total_w or t.finished:
        return None
    now = t.elapsed or 0.0
    then = min(_finished_at.get(t.id, now), now)
    rate = then / done_w
    if then == now:
        return rate * (total_w - done_w)
    largest = max((w for i, w in enumerate(weights) if i not in finished), default=0)
    return max(rate * (total_w - done_w) - (now - then), rate * (total_w - done_w - largest), 0.0)


class TimeLeftColumn(ProgressColumn):
    """The bar's time left, by :func:`_time_left`."""

    def render(self, task: Task) -> Text:
        left = 0.0 if task.finished else _time_left(task)
        return Text("-:--:--" if left is None else f"~{timedelta(seconds=round(left))} left", style="progress.remaining")


def _plain_line(bar: Progress, task: TaskID, label: str) -> None:
    """One plain progress line, with the time left by :func:`_time_left`."""
    t = bar.tasks[task]
    _last_line[task] = time.monotonic()
    left = _time_left(t)
    err.print(f"{label} {t.completed:.0f}/{t.total:.0f} trajectories, {t.elapsed or 0.0:.0f} s"
              + ("" if left is None else f", about {left:.0f} s left"), highlight=False)


def advance(bar: Progress, task: TaskID, label: str) -> None:
    """Advance ``task``; when stderr is not a terminal (a log file, CI), where rich draws no live
    bar, also print a plain line every :data:`PLAIN_PROGRESS_SECONDS` and at the end."""
    bar.advance(task)
    t = bar.tasks[task]
    _finished_at[task] = t.elapsed or 0.0
    if err.is_terminal:
        return
    if t.finished or time.monotonic() - _last_line.get(task, 0.0) >= PLAIN_PROGRESS_SECONDS:
        _plain_line(bar, task, label)


@contextmanager
def heartbeat(bar: Progress, task: TaskID, label: str, work: tuple[list[float], dict] | None = None) -> Iterator[None]:
    """When stderr is not a terminal, print the plain progress line every
    :data:`HEARTBEAT_SECONDS` even if no trajectory finishes (one can take minutes). ``work``: the
    work per trajectory and the dict of those finished, for the time left (:data:`_work`), while
    the block runs."""
    stop = threading.Event()
    _finished_at.pop(task, None)  # (task ids restart at 0 in every progress bar)
    if work is not None:
        _work[task] = work

    def beat() -> None:
        while not stop.wait(HEARTBEAT_SECONDS / 3):
            if time.monotonic() - _last_line.get(task, 0.0) >= HEARTBEAT_SECONDS and not bar.tasks[task].finished:
                _plain_line(bar, task, label)

    _last_line[task] = time.monotonic()
    thread = threading.Thread(target=beat, daemon=True) if not err.is_terminal else None
    if thread:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        _work.pop(task, None)
        _finished_at.pop(task, None)

