"""Schema versions and forward migrations of the SQL stores (SQLite and PostgreSQL).

Each backend lists its :class:`Migration` steps in order (``sqlite.MIGRATIONS``,
``postgres.MIGRATIONS``); a store records the version it is at in a one-row table
``schema_version``. On every open, in one transaction (SQLite ``BEGIN IMMEDIATE``; PostgreSQL under
an advisory lock, so instances starting together migrate once), the store reads its version, runs
the steps above it in order and records the new version; a step that fails rolls the whole upgrade
back and the store is left as it was.

* A store written before versions were recorded (no ``schema_version`` row) is at version 0: its
  tables are those of steps 1 and 2, which are written ``CREATE … IF NOT EXISTS`` so that they
  apply to it unchanged. Every later step runs exactly once per store and may alter tables.
* A database that is not a historygraph store (tables of another program and none of ours, tables
  named ``sessions`` and ``events`` without our columns, :data:`OWN_COLUMNS`, or a file that is
  not a database) is refused with :class:`ForeignDatabaseError` before anything is
  written to it (SQLite: before the switch to WAL, which would change the file).
* A store at a version newer than this historygraph knows (written by a later release) is refused
  with :class:`SchemaVersionError` rather than used, so an older release never writes rows a newer
  schema does not expect.

To change the schema: append a ``Migration(n + 1, summary, sql)`` to both backends' lists (SQL
statements separated by ``;``, no ``;`` inside literals), and add a test opening a store at version
``n`` (tests/test_migrations.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"
OWN_COLUMNS = {"sessions": ("id", "created", "meta"), "events": ("session_id", "position", "data")}
"""Columns of migration 1's ``sessions`` and ``events`` (both backends), which a database holding
tables of these names must have to be taken for a historygraph store (:func:`refuse_foreign_columns`)."""


class SchemaVersionError(RuntimeError):
    """A store's schema is newer than this historygraph supports (names both versions)."""


class ForeignDatabaseError(SchemaVersionError):
    """The database holds another program's tables, or is not a database: historygraph refuses to
    add its tables to it (names the file and what it found)."""


@dataclass(frozen=True)
class Migration:
    """One forward step: after it the store is at ``version``; ``sql`` is its DDL (``;``-separated)."""

    version: int
    summary: str
    sql: str

    def statements(self) -> list[str]:
        return [s.strip() for s in self.sql.split(";") if s.strip()]


def refuse_foreign_columns(found: dict[str, list[str]], where: str) -> None:
    """Raise :class:`ForeignDatabaseError` when tables named ``sessions`` and ``events`` (``found``:
    each one's columns) lack :data:`OWN_COLUMNS`: another program's tables of the same names, which
    historygraph must not add its own tables to (issue 50: every request then failed with 500)."""
    if all(set(cols) <= set(found.get(t, ())) for t, cols in OWN_COLUMNS.items()):
        return
    theirs = ", ".join(f"{t}({', '.join(found.get(t, ()))})" for t in OWN_COLUMNS)
    ours = ", ".join(f"{t}({', '.join(cols)})" for t, cols in OWN_COLUMNS.items())
    raise ForeignDatabaseError(f"{where} is not a historygraph store: its tables {theirs} are not historygraph's {ours} "
                               f"(another program's tables of the same names); give --store (or HISTORYGRAPH_DB) a new "
                               f"file or database, or an existing historygraph store; it was left as it was")


def check(migrations: Sequence[Migration]) -> int:
    """The newest version of ``migrations`` after checking they are numbered 1, 2, … in order."""
    for i, m in enumerate(migrations, 1):
        if m.version != i:
            raise ValueError(f"migration {m.summary!r} has version {m.version}, expected {i}")
    return len(migrations)


def pending(migrations: Sequence[Migration], current: int, where: str) -> list[Migration]:
    """The steps a store at version ``current`` needs, in order.

    Raises:
        SchemaVersionError: ``current`` is newer than the newest of ``migrations``.
    """
    newest = check(migrations)
    if current > newest:
        raise SchemaVersionError(f"store {where} has schema version {current}, newer than the {newest} this "
                                 f"historygraph supports: upgrade historygraph to open it")
    return list(migrations[current:])
