"""Capture what a client really sends: a local HTTP server that saves every request body and answers 400.

    python bench/dump_requests.py OUT_DIR [PORT]      # then point the client at http://127.0.0.1:PORT
The bodies land in OUT_DIR as NNN-METHOD-path.json (tests/fixtures/clients/ holds the ones we replay).
"""
import http.server, pathlib, sys, itertools  # noqa: E401

out, port, n = pathlib.Path(sys.argv[1]), int(sys.argv[2] if len(sys.argv) > 2 else 8899), itertools.count()


class Dump(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        name = f"{next(n):03d}-{self.command}-{self.path.strip('/').replace('/', '_').replace('?', '_')}.json"
        out.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(body)
        self.send_response(400)
        self.end_headers()

    do_GET = do_POST  # noqa: N815 (http.server's name)


http.server.ThreadingHTTPServer(("127.0.0.1", port), Dump).serve_forever()
