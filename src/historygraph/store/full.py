"""A store whose disk is full (issue 38, class 6): how each backend says it, and the one error the
store raises for it.

* SQLite: ``sqlite3.OperationalError`` "database or disk is full" (result code ``SQLITE_FULL``,
  https://www.sqlite.org/rescode.html#full);
* the operating system: ``OSError`` with ``errno.ENOSPC`` ("No space left on device");
* PostgreSQL: SQLSTATE ``53100`` ``disk_full`` ("could not extend file …",
  https://www.postgresql.org/docs/current/errcodes-appendix.html), psycopg's ``errors.DiskFull``.

:meth:`~historygraph.store.base.Store.append` (and ``create_session``, ``flush``) turn any of these
into :class:`StoreFullError` after rolling the write back, and keep the reason in
:attr:`~historygraph.store.base.Store.full` until a later write succeeds; the proxy answers it
with 507 and reports it in ``/health`` (docs/proxy.md, "A full disk"), neither naming the store's
file (:attr:`StoreFullError.reason`); the server's log does.
"""

from __future__ import annotations

import errno
import sqlite3

PG_DISK_FULL = "53100"
"""PostgreSQL's SQLSTATE ``disk_full`` (class 53, insufficient resources)."""


class StoreFullError(OSError):
    """A write refused because the store's disk is full; nothing of it was written (its
    transaction was rolled back). ``errno`` is ``ENOSPC``; the message names the store (``where``:
    its file path) and the backend's own error, for the server's log; ``reason`` says the same
    without the store's location, for a client (issue 50: the 507 named the file)."""

    def __init__(self, where: str, cause: BaseException) -> None:
        super().__init__(errno.ENOSPC, f"the store's disk is full ({where}): {type(cause).__name__}: {cause}")
        self.where = where
        self.reason = f"the store's disk is full: {described(cause)}"


def described(exc: BaseException) -> str:
    """``exc`` as ``"Type: message"``, without the file name an ``OSError`` carries (so a path on
    the server is not shown to a client: the 507's message, ``/health``)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: [Errno {exc.errno}] {exc.strerror}"
    return f"{type(exc).__name__}: {exc}"


def disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it was raised from, says the disk is full (module
    docstring)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, StoreFullError):
            return True
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        if getattr(exc, "sqlstate", None) == PG_DISK_FULL:
            return True
        if isinstance(exc, sqlite3.OperationalError) and (
                getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
