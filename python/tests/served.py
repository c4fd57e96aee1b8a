"""`dlframe serve` as a real process on an ephemeral loopback port, for the Flight SQL tests and
benches/flight.py: started from the CLI binary, stopped with SIGTERM (killed if it lingers), and
every wait bounded."""

from __future__ import annotations

import os
import pathlib
import queue
import signal
import subprocess
import threading

ROOT = pathlib.Path(__file__).resolve().parents[2]


def cli_path(profile: str = "debug") -> pathlib.Path:
    """The dlframe binary: $DLFRAME_CLI, or target/<profile>/dlframe."""
    return pathlib.Path(os.environ.get("DLFRAME_CLI", ROOT / "target" / profile / "dlframe"))


def statement_query(sql: str) -> bytes:
    """A Flight SQL CommandStatementQuery wrapped in google.protobuf.Any, the command that
    pyarrow.flight (which has no Flight SQL client) sends in a FlightDescriptor."""
    from dlframe.flight import statement_command

    return statement_command(sql)


class Served:
    """A running `dlframe serve --listen 127.0.0.1:0 ARGS...`; `uri` is its grpc:// address."""

    def __init__(self, cli: pathlib.Path, *args: str, token: str | None = None, timeout: float = 60):
        env = {k: v for k, v in os.environ.items() if k != "DLFRAME_TOKEN"}
        if token is not None:
            env["DLFRAME_TOKEN"] = token
        self.timeout = timeout
        self.proc = subprocess.Popen(
            [str(cli), "serve", "--listen", "127.0.0.1:0", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.errors: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.errors.append), daemon=True).start()
        line = self.wait_for("listening on ")
        self.uri = "grpc://" + line.rsplit(" ", 1)[1]

    @staticmethod
    def _read(pipe, put) -> None:
        for line in pipe:
            put(line.rstrip("\n"))
        put(None)

    def wait_for(self, text: str) -> str:
        """The next stdout line containing `text`; fails (and stops the server) after the timeout."""
        while True:
            try:
                line = self.lines.get(timeout=self.timeout)
            except queue.Empty:
                line = None
            if line is None:
                self.kill()
                raise RuntimeError(f"dlframe serve printed no {text!r}; stderr: {' '.join(self.errors)}")
            if text in line:
                return line

    def stop(self) -> int:
        """SIGTERM, then the exit code (bounded; killed past the timeout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def serve_table(table_dir: pathlib.Path, token: str):
    """A module fixture's body: `dlframe serve --table t=TABLE_DIR` with `token`, skipped (saying
    why) when the CLI is not built; stopped with SIGTERM after the tests, which must exit 0."""
    import pytest  # the tests' fixture only: benches/flight.py imports this module without pytest

    cli = cli_path()
    if not cli.exists():
        pytest.skip(f"the dlframe CLI is not built at {cli}: run `cargo build -p dlframe-cli --features serve`")
    s = Served(cli, "--table", f"t={table_dir}", token=token)
    yield s
    code = s.stop()
    assert code == 0, f"dlframe serve exited with {code} on SIGTERM; stderr: {s.errors}"
