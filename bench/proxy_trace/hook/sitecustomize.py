"""Diagnostics for ``bench/proxy_trace/split.py``, active only in a proxy worker process (where
``$HISTORYGRAPH_SERVE_CONFIG`` is set) and only with its ``HG_*`` switches set; see split.py."""
# ruff: noqa
import os
if os.environ.get("HISTORYGRAPH_SERVE_CONFIG") and os.environ.get("HG_TRACE"):
    import time, contextvars, json, asyncio, threading, atexit
    from historygraph.server import app as A
    from historygraph.server import chat as C, messages as M, proxy as P, responses as R
    from historygraph.store import sqlite as S
    cur = contextvars.ContextVar("rec", default=None)
    out = open(f"{os.environ['HG_TRACE']}/trace-{os.getpid()}.jsonl", "w")
    lags = []
    orig_call = A.Arrival.__call__
    async def call(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            return await orig_call(self, scope, receive, send)
        rec = {"t0": time.perf_counter(), "cpu0": time.thread_time(), "pool": [], "up": None}
        tok = cur.set(rec)
        async def send2(msg):
            if msg["type"] == "http.response.start":
                rec["t_resp"] = time.perf_counter()
            await send(msg)
        try:
            await orig_call(self, scope, receive, send2)
        finally:
            rec["t_end"] = time.perf_counter()
            cur.reset(tok)
            out.write(json.dumps(rec) + "\n")
    A.Arrival.__call__ = call
    orig_pool = P.run_in_threadpool
    async def pool(fn, *a, **k):
        rec = cur.get()
        if rec is None:
            return await orig_pool(fn, *a, **k)
        ent = {"name": getattr(fn, "__name__", "?"), "sub": time.perf_counter()}
        def wrapped(*a, **k):
            ent["start"] = time.perf_counter(); c = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                ent["end"] = time.perf_counter(); ent["cpu"] = time.thread_time() - c
        r = await orig_pool(wrapped, *a, **k)
        ent["back"] = time.perf_counter()
        rec["pool"].append(ent)
        return r
    for _mod in (P, C, M, R):  # every module that hands work to the pool
        _mod.run_in_threadpool = pool
    orig_send = P.Proxy.send
    async def psend(self, req):
        rec = cur.get(); t = time.perf_counter()
        try:
            return await orig_send(self, req)
        finally:
            if rec is not None:
                rec["up"] = [t, time.perf_counter()]
    P.Proxy.send = psend
    orig_fwd = P.Proxy.forward
    async def pfwd(self, *a, **k):
        rec = cur.get(); t = time.perf_counter()
        if rec is not None: rec["fwd0"] = t
        return await orig_fwd(self, *a, **k)
    P.Proxy.forward = pfwd
    # SQLite write transaction: time to get BEGIN IMMEDIATE and python-lock wait
    from contextlib import contextmanager
    waits = open(f"{os.environ['HG_TRACE']}/sqlite-{os.getpid()}.jsonl", "w")
    orig_wt = S.SQLiteStore._write_transaction
    @contextmanager
    def wt(self, sid):
        t0 = time.perf_counter()
        with self._lock:
            t1 = time.perf_counter()
            self._db.execute("BEGIN IMMEDIATE")
            t2 = time.perf_counter()
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK"); raise
            t3 = time.perf_counter()
            self._db.execute("COMMIT")
            t4 = time.perf_counter()
        waits.write(json.dumps([t0, t1 - t0, t2 - t1, t3 - t2, t4 - t3, threading.get_ident()]) + "\n")
    S.SQLiteStore._write_transaction = wt
    # loop lag monitor, started on first request
    started = [False]
    orig_call2 = A.Arrival.__call__
    async def call3(self, scope, receive, send):
        if not started[0]:
            started[0] = True
            async def mon():
                lf = open(f"{os.environ['HG_TRACE']}/lag-{os.getpid()}.txt", "w", buffering=1)
                while True:
                    t = time.perf_counter(); await asyncio.sleep(0.002)
                    lf.write(f"{t:.6f} {(time.perf_counter() - t - 0.002)*1000:.3f}\n")
            asyncio.get_running_loop().create_task(mon())
        return await orig_call2(self, scope, receive, send)
    A.Arrival.__call__ = call3
    def flush():
        out.flush(); waits.flush()
    atexit.register(flush)
if os.environ.get("HISTORYGRAPH_SERVE_CONFIG") and os.environ.get("HG_REUSEPORT"):
    import socket as _s
    import uvicorn.server as _us
    _orig_startup = _us.Server.startup
    async def _startup(self, sockets=None):
        if sockets:
            addr = sockets[0].getsockname()
            new = _s.socket(_s.AF_INET, _s.SOCK_STREAM)
            new.setsockopt(_s.SOL_SOCKET, _s.SO_REUSEADDR, 1)
            new.setsockopt(_s.SOL_SOCKET, _s.SO_REUSEPORT, 1)
            new.bind(addr)
            sockets = [new]
        return await _orig_startup(self, sockets)
    _us.Server.startup = _startup
if os.environ.get("HG_REUSEPORT") and not os.environ.get("HISTORYGRAPH_SERVE_CONFIG"):
    try:
        import uvicorn.config as _uc, socket as _s2
        def _bind(self):
            s = _s2.socket(_s2.AF_INET, _s2.SOCK_STREAM)
            s.setsockopt(_s2.SOL_SOCKET, _s2.SO_REUSEADDR, 1)
            s.setsockopt(_s2.SOL_SOCKET, _s2.SO_REUSEPORT, 1)
            s.bind((self.host, self.port)); s.set_inheritable(True)
            return s
        _uc.Config.bind_socket = _bind
    except ImportError:
        pass
if os.environ.get("HISTORYGRAPH_SERVE_CONFIG") and os.environ.get("HG_THREADS"):
    from historygraph.server import proxy as _P2
    _P2.THREADS = int(os.environ["HG_THREADS"])
if os.environ.get("HISTORYGRAPH_SERVE_CONFIG") and os.environ.get("HG_SWITCH"):
    import sys as _sys
    _sys.setswitchinterval(float(os.environ["HG_SWITCH"]))
