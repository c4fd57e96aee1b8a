#!/usr/bin/env bash
# The README's test command: sets up and runs every test suite of the project.
# Debug builds only, one shared target/ (CI has 2 cores and 90 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== The main job: the dlframe CLI (crate dlframe-cli, cli/) on its built-in example, built as"
echo "   the README's first command builds it: without the services (feature serve), which then say"
echo "   how to build them"
cargo run --locked -p dlframe-cli --bin dlframe
if refused="$(./target/debug/dlframe serve 2>&1)"; then
  echo "dlframe serve ran in a build without the feature serve" >&2; exit 1
fi
grep -q -- "--features serve" <<<"$refused" || { echo "dlframe serve said: $refused" >&2; exit 1; }

echo "== Rust: cargo test --workspace, the CLI with its services (unit, integration, property and"
echo "   doc tests; dlframe's tests turn on its cuda feature, so the CUDA layer is built and tested"
echo "   here too). NVRTC is not on the library path yet: its test is skipped here, explicitly, and"
echo "   runs in the CUDA step below. This leaves ./target/debug/dlframe with the services, for the"
echo "   Python tests of the servers"
DLFRAME_ALLOW_SKIP_NVRTC=1 cargo test --workspace --locked --features dlframe-cli/serve

echo "== Python: virtualenv .venv with the real consumers (numpy, pyarrow, polars, datafusion, jax)"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r python/requirements-test.txt
if [ -n "${DLFRAME_TORCH:-}" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "torch>=2.4" "torchdata>=0.11"
fi

echo "== Rust: the CUDA tests again, with their output: the kernels built for the CPU (the"
echo "   emulator; needs a C++ compiler) and NVRTC (from PyPI's nvidia-cuda-nvrtc-cu12 in .venv; no"
echo "   driver or GPU needed) must run and say how many cases they ran; the tests that need a GPU"
echo "   say why they skip. Same build as above: nothing is rebuilt"
NVRTC_LIB="$(.venv/bin/python -c 'import os, nvidia.cuda_nvrtc as m; print(os.path.join(list(m.__path__)[0], "lib"))')"
LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  cargo test --workspace --locked --features dlframe-cli/serve --lib -- cuda --nocapture

echo "== Python: maturin develop (debug build into .venv, same target/ as cargo)"
(
  cd python
  VIRTUAL_ENV="$PWD/../.venv" PATH="$PWD/../.venv/bin:$PATH" CARGO_TARGET_DIR="$PWD/../target" \
    ../.venv/bin/maturin develop --quiet --features bench-internals
)

echo "== Python: pytest (skipped tests print their reason)"
(cd python && ../.venv/bin/python -m pytest -q -ra tests)

echo "== Python: the Polars tests again on the oldest supported line (polars 1.43), same build"
if [ ! -x .venv-polars1/bin/python ]; then
  python3 -m venv .venv-polars1
fi
.venv-polars1/bin/python -m pip install --quiet --disable-pip-version-check -r python/requirements-polars1.txt
cd python
PYTHONPATH="$PWD" ../.venv-polars1/bin/python -m pytest -q -ra -p no:cacheprovider tests/test_polars.py tests/test_polars_plugin.py
