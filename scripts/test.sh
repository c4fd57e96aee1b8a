#!/usr/bin/env bash
# The README's test command: sets up and runs every test suite of the project.
# Debug builds only, one shared target/ (CI has 2 cores and 90 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== Rust: cargo test --workspace (unit, integration, property and doc tests; the Python"
echo "   crate turns on dlframe's cuda feature, so the CUDA layer is built and tested here too)"
cargo test --workspace --locked
echo "== Rust: CUDA tests, with their output (they say why they skip on a machine without a GPU)"
# Same workspace build (the features are unified, so dlframe has cuda on): nothing is rebuilt.
cargo test --workspace --locked --lib -- cuda --nocapture
echo "== The main job: the dlframe CLI on its built-in example (built by the tests above)"
./target/debug/dlframe

echo "== Python: virtualenv .venv with the real consumers (numpy, pyarrow, polars, datafusion, jax)"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r python/requirements-test.txt
if [ -n "${DLFRAME_TORCH:-}" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "torch>=2.4"
fi

echo "== Rust: NVRTC compiles the CUDA kernels (NVRTC from PyPI's nvidia-cuda-nvrtc-cu12 in .venv;"
echo "   no driver or GPU needed; same build as above)"
NVRTC_LIB="$(.venv/bin/python -c 'import os, nvidia.cuda_nvrtc as m; print(os.path.join(list(m.__path__)[0], "lib"))')"
LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  cargo test --workspace --locked --lib -- cuda::tests::nvrtc --nocapture

echo "== Python: maturin develop (debug build into .venv, same target/ as cargo)"
(
  cd python
  VIRTUAL_ENV="$PWD/../.venv" PATH="$PWD/../.venv/bin:$PATH" CARGO_TARGET_DIR="$PWD/../target" \
    ../.venv/bin/maturin develop --quiet
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
