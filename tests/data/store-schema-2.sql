-- A SQLite store written by historygraph before schema versions (sessions, events, embeddings,
-- texts, append_keys), dumped with sqlite3 iterdump(); tests/test_migrations.py opens it.
BEGIN TRANSACTION;
CREATE TABLE append_keys (
    id INTEGER PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), key TEXT NOT NULL,
    fingerprint TEXT NOT NULL, start_position INTEGER NOT NULL, event_count INTEGER NOT NULL, UNIQUE (session_id, key));
INSERT INTO "append_keys" VALUES(1,'run-1','k1','ed144f6c08b1452f4688a3b7ca4cd7831aabf2c30313d82ec3717c6c9ee617cb',0,3);
CREATE TABLE embeddings (key TEXT PRIMARY KEY, vector BLOB NOT NULL);
INSERT INTO "embeddings" VALUES('h1',X'000000000000803F0000004000004040');
CREATE TABLE events (
    session_id TEXT NOT NULL REFERENCES sessions(id), position INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (session_id, position));
INSERT INTO "events" VALUES('run-1',0,'{"role": "user", "content": "find the bug"}');
INSERT INTO "events" VALUES('run-1',1,'{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": \"pytest\"}"}}]}');
INSERT INTO "events" VALUES('run-1',2,'{"role": "tool", "content": "FAILED test_x", "tool_call_id": "c1"}');
INSERT INTO "events" VALUES('run-1~1',0,'{"role": "user", "content": "other"}');
CREATE TABLE sessions (id TEXT PRIMARY KEY, created REAL NOT NULL, meta TEXT NOT NULL);
INSERT INTO "sessions" VALUES('run-1',1.79611695277418971063e+09,'{"source": "schema-2 fixture"}');
INSERT INTO "sessions" VALUES('run-1~1',1.79611695277489638328e+09,'{"parent": "run-1", "forked_at": 1}');
CREATE TABLE texts (kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (kind, key));
INSERT INTO "texts" VALUES('summary','k','a summary');
CREATE INDEX append_keys_order ON append_keys (session_id, id);
COMMIT;
