#!/usr/bin/env bash
# The README's test command: sets up and runs every test suite of the project.
# Debug builds only, one shared target/ (CI has 2 cores and 90 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== Rust: cargo test --workspace (unit, integration, property and doc tests)"
cargo test --workspace --locked
