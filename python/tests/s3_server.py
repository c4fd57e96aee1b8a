"""A real S3-compatible server on loopback for the tests: moto's S3 app, run in a process of its
own, behind a layer that logs every request (method, object, Range, the access key that signed
it, bytes sent) as a line of JSON before its response goes out.

Run as ``python s3_server.py LOG``: it prints ``PORT n`` and serves until it is stopped."""

import json
import os
import re
import subprocess
import sys
import threading


def serve(log_path: str) -> None:
    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    app = create_backend_app("s3")
    lock = threading.Lock()
    log = open(log_path, "a", buffering=1)
    key = re.compile(r"Credential=([^/]+)/")

    def logged(environ, start_response):
        signed = key.search(environ.get("HTTP_AUTHORIZATION", ""))
        rec = {
            "method": environ["REQUEST_METHOD"],
            "path": environ.get("PATH_INFO", ""),
            "query": environ.get("QUERY_STRING", ""),
            "range": environ.get("HTTP_RANGE"),
            "key": signed.group(1) if signed else None,
        }

        def respond(status, headers, exc_info=None):
            # Logged before the response leaves, so that a client never sees it first.
            h = {k.lower(): v for k, v in headers}
            rec["status"] = int(status.split()[0])
            rec["sent"] = 0 if rec["method"] == "HEAD" else int(h.get("content-length", -1))
            with lock:
                log.write(json.dumps(rec) + "\n")
            return start_response(status, headers, exc_info)

        return app(environ, respond)

    server = make_server("127.0.0.1", 0, logged, threaded=True, request_handler=MotoRequestHandler)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


class S3Server:
    """The server as a child process on an ephemeral loopback port; ``stop()`` ends it."""

    def __init__(self, log_path: str, timeout: float = 30) -> None:
        self.log_path = log_path
        open(log_path, "w").close()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, os.path.abspath(__file__), log_path]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not line or not line[0].startswith("PORT "):
            self.stop()
            raise RuntimeError(f"the S3 server did not start within {timeout} s: {line!r}")
        self.endpoint = f"127.0.0.1:{int(line[0].split()[1])}"

    def filesystem(self, access_key: str = "testing", **kw):
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            access_key=access_key,
            secret_key="testing",
            region="us-east-1",
            endpoint_override=self.endpoint,
            scheme="http",
            **kw,
        )

    def ranges(self, access_key: str) -> list[tuple[str, int, int]]:
        """(object, offset, bytes) of every object GET signed with `access_key`."""
        out = []
        with open(self.log_path) as f:
            for line in f:
                r = json.loads(line)
                if r["method"] != "GET" or r["query"] or r["key"] != access_key:
                    continue  # listings carry a query string
                m = re.match(r"bytes=(\d+)-", r["range"] or "")
                out.append((r["path"].lstrip("/"), int(m.group(1)) if m else 0, r["sent"]))
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


if __name__ == "__main__":
    serve(sys.argv[1])
