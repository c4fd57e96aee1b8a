"""The README's snippets, run as written: each ```python block in a fresh interpreter, and the
```sh commands that run the `dlframe` CLI (with the built target/debug/dlframe instead of
`cargo run`). A snippet that fails here fails for a reader who copies it."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>\w*)\s*$")


def blocks(lang: str) -> list[tuple[int, str]]:
    """The README's fenced blocks of one language, as (first line number, dedented code)."""
    out, current, start, indent = [], None, 0, ""
    for number, line in enumerate(README.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if m and current is None:
            current, start, indent = ([] if m["lang"] == lang else False), number, m["indent"]
        elif m and line.strip() == "```":
            if current:
                out.append((start, "\n".join(current) + "\n"))
            current = None
        elif current is not None and current is not False:
            current.append(line[len(indent) :] if line.startswith(indent) else line)
    return out


def commands(code: str) -> list[str]:
    """The shell commands of a block, with backslash continuations joined."""
    return [c.strip() for c in code.replace("\\\n", " ").splitlines() if c.strip() and not c.lstrip().startswith("#")]


def cli() -> Path:
    """The debug `dlframe` binary that `cargo run --bin dlframe` would run."""
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    binary = target / "debug" / "dlframe"
    if not binary.exists():
        pytest.skip(f"{binary} is not built (cargo build -p dlframe-cli)")
    return binary


CARGO_RUN = re.compile(r"^cargo run( -p \S+)? --bin dlframe( --)?(?= |$)")
CLI_COMMANDS = [
    (line, c) for line, code in blocks("sh") for c in commands(code) if CARGO_RUN.match(c) or c.split()[0] == "dlframe"
]


@pytest.mark.parametrize("line, code", blocks("python"), ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_python_snippet_runs_as_written(line, code, tmp_path):
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"README.md line {line}: the snippet fails as written:\n{code}\n{r.stderr[-3000:]}"


@pytest.mark.parametrize("line, command", CLI_COMMANDS, ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_cli_snippet_runs_as_written(line, command, tmp_path):
    argv = [str(cli())] + shlex.split(CARGO_RUN.sub("", command).removeprefix("dlframe"), comments=True)
    needed = [a.split("=", 1)[1] for a, prev in zip(argv[1:], argv) if prev == "--table" and "=" in a]
    missing = [p for p in needed if not (tmp_path / p).exists()]
    if missing:
        pytest.skip(f"README.md line {line} reads {', '.join(missing)}, which the README does not create")
    r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"README.md line {line}: `{command}` fails:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"


def test_the_readme_has_the_snippets_this_test_runs():
    assert len(blocks("python")) >= 3 and CLI_COMMANDS, "the README lost its Python or CLI snippets"
