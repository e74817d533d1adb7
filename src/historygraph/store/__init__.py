"""Session stores: :class:`MemoryStore`, :class:`SQLiteStore` (the embedded default) and
:class:`~historygraph.store.postgres.PostgresStore` (shared by several instances; needs psycopg)."""

from .base import SessionInfo, Store, StoreError
from .memory import MemoryStore
from .sqlite import SQLiteStore, default_path

__all__ = ["MemoryStore", "SQLiteStore", "SessionInfo", "Store", "StoreError", "default_path", "open_store"]


def open_store(url: str | None = None) -> Store:
    """``None`` → SQLite at the default path; ``":memory:"`` → :class:`MemoryStore`; anything
    else is a SQLite file path (``sqlite:///path`` accepted); ``postgresql://…`` or
    ``postgres://…`` → :class:`~historygraph.store.postgres.PostgresStore`."""
    if url == ":memory:":
        return MemoryStore()
    if url and url.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresStore

        return PostgresStore(url)
    if url and url.startswith("sqlite:///"):
        url = url[len("sqlite:///"):]
    return SQLiteStore(url)
