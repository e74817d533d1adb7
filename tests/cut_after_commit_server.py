"""``historygraph serve`` that SIGKILLs itself right after committing one append, before answering
it: the cut a retry with an ``Idempotency-Key`` must survive (issue 17; run as a process).

``python cut_after_commit_server.py STORE PORT KEY`` serves the proxy app on 127.0.0.1:PORT over
STORE; the append carrying ``Idempotency-Key: KEY`` is committed (events and key, one
transaction), then the process is killed, so the client's connection is cut without an answer.
"""

import os
import signal
import sys
from contextlib import contextmanager

import uvicorn

from historygraph.server.app import create_app
from historygraph.server.config import ServerConfig
from historygraph.store import open_store


def main() -> None:
    store_url, port, cut_key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    store = open_store(store_url)
    write_key, transaction = store._write_append_key, store._write_transaction
    seen: list[str] = []

    def recording_write_key(session_id, key, *args):
        write_key(session_id, key, *args)
        seen.append(key)

    @contextmanager
    def cutting_transaction(session_id):
        with transaction(session_id):
            yield
        if cut_key in seen:  # committed: die before the answer is sent
            os.kill(os.getpid(), signal.SIGKILL)

    store._write_append_key, store._write_transaction = recording_write_key, cutting_transaction
    app = create_app(ServerConfig(upstream="http://127.0.0.1:9/v1", store=store_url, policy="prune"), store)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
