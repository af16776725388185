"""A stand-in for nvidia-pytriton's ``tritonserver`` binary, for launcher tests on any host.

It takes the options :class:`kernel_lens.serving.tritonserver.TritonServer` passes, starts a
"stub" child (a sleeping Python, as the python backend's stubs are the server's children) and,
by $FAKE_TRITONSERVER_MODE:
- ``serve`` (default): listens on --grpc-port and serves HTTP on --http-port (``/v2/health/live``,
  ``/v2``, ``/v2/repository/index``), logging Triton's "Started HTTPService at ..." line;
- ``idle``: runs and never binds (as a server whose port another process holds);
- ``exit``: prints an error and exits with status 1 at once (no stub).
$FAKE_TRITONSERVER_PIDS, when set, names a file that receives "<server pid> <stub pid>".
"""

import argparse
import http.server
import json
import os
import socket
import subprocess
import sys
import time


class Handler(http.server.BaseHTTPRequestHandler):
    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v2/health/live":
            self._answer(b"")
        elif self.path == "/v2":
            self._answer(json.dumps({"name": "fake_tritonserver", "version": "0"}).encode())
        else:
            self.send_error(404)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v2/repository/index":
            self._answer(b"[]")
        else:
            self.send_error(404)

    def log_message(self, *args):
        pass


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    args, _ = parser.parse_known_args()
    mode = os.environ.get("FAKE_TRITONSERVER_MODE", "serve")
    if mode == "exit":
        print(f"E fake_tritonserver: failed to start HTTP service on port {args.http_port}", flush=True)
        return 1
    stub = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if os.environ.get("FAKE_TRITONSERVER_PIDS"):
        with open(os.environ["FAKE_TRITONSERVER_PIDS"], "w") as fh:
            fh.write(f"{os.getpid()} {stub.pid}\n")
    if mode == "idle":
        time.sleep(600)
        return 0
    grpc = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    grpc.bind(("127.0.0.1", args.grpc_port))
    grpc.listen()
    server = http.server.HTTPServer(("127.0.0.1", args.http_port), Handler)
    print(f"I fake_tritonserver: Started HTTPService at 127.0.0.1:{args.http_port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
