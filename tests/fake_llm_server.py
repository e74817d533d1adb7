"""A real OpenAI-compatible HTTP server with deterministic answers, for tests (run as a process).

``python fake_llm_server.py`` listens on 127.0.0.1 at a free port, prints the port on stdout and
serves ``POST /v1/chat/completions``: the answer is ``"digest of <n> chars"`` where ``n`` is the
number of characters in all request messages, with usage ``prompt_tokens = n // 4`` and
``completion_tokens = 4``.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        n = sum(len(m["content"]) for m in body["messages"])
        out = json.dumps({"choices": [{"message": {"role": "assistant", "content": f"digest of {n} chars"}}],
                          "usage": {"prompt_tokens": n // 4, "completion_tokens": 4}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args) -> None:  # keep test output quiet
        pass


if __name__ == "__main__":
    server = HTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    sys.stdout.close()
    server.serve_forever()
