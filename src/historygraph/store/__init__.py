"""Session stores: :class:`MemoryStore`, :class:`SQLiteStore` (the embedded default) and
:class:`~historygraph.store.postgres.PostgresStore` (shared by several instances; needs psycopg)."""

from pathlib import Path

from historygraph.store.appends import KEPT_KEYS, AppendConflict
from historygraph.store.base import SessionInfo, Store, StoreError
from historygraph.store.full import StoreFullError
from historygraph.store.memory import MemoryStore
from historygraph.store.migrations import ForeignDatabaseError, SchemaVersionError
from historygraph.store.sqlite import SQLiteStore, default_path

__all__ = ["AppendConflict", "ForeignDatabaseError", "KEPT_KEYS", "MemoryStore", "SQLiteStore", "SchemaVersionError", "SessionInfo", "Store", "StoreError", "StoreFullError", "default_path", "open_store"]


def open_store(url: str | None = None, must_exist: bool = False) -> Store:
    """``None`` → SQLite at the default path; ``":memory:"`` → :class:`MemoryStore`; anything
    else is a SQLite file path (``sqlite:///path`` accepted); ``postgresql://…`` or
    ``postgres://…`` → :class:`~historygraph.store.postgres.PostgresStore`.

    Raises:
        StoreError: ``must_exist`` is set and the SQLite file does not exist (nothing is created).
    """
    if url == ":memory:":
        return MemoryStore()
    if url and url.startswith(("postgresql://", "postgres://")):
        from historygraph.store.postgres import PostgresStore

        return PostgresStore(url)
    if url and url.startswith("sqlite:///"):
        url = url[len("sqlite:///"):]
    if must_exist and not (Path(url) if url else default_path()).is_file():
        raise StoreError(f"no store at {Path(url) if url else default_path()}")
    return SQLiteStore(url)
