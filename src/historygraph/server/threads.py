"""The worker threads of the request path: blocking work (routing, storing, rendering) runs off the
event loop in a pool of this process's own, which every API module shares."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Callable

THREADS = 40
"""Worker threads per process for the request path's blocking work (routing, storing, rendering:
:func:`run_in_threadpool`); anyio's default limit, which the proxy had before."""
_pool: ThreadPoolExecutor | None = None
_pool_guard = threading.Lock()


async def run_in_threadpool(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in one of this process's :data:`THREADS` worker threads, awaited on
    the event loop (which a render or a store call must never block): asyncio's executor hand-off
    (``loop.run_in_executor``) on a pool of our own. Starlette's ``run_in_threadpool`` (anyio's
    ``to_thread``: a capacity limiter, a cancel scope and a context copy per call) took 40–90 µs
    more CPU per call, two calls per proxied request (bench/RESULTS.md). When the awaiting request
    is cancelled (the client went away) the call still runs to its end in its thread, as before;
    only the wait for it ends."""
    global _pool
    if _pool is None:
        with _pool_guard:
            if _pool is None:
                _pool = ThreadPoolExecutor(THREADS, thread_name_prefix="historygraph")
    return await asyncio.get_running_loop().run_in_executor(_pool, partial(fn, *args, **kwargs))
