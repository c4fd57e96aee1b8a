#!/usr/bin/env bash
# The checks that need a GPU, in two halves, for a session lent a GPU machine (which has torch,
# cupy and jax with CUDA, but no Rust, no internet, and no Polars or DataFusion):
#
#   bash scripts/gpu_session.sh prepare   here, without a GPU: builds into .gpu/ (ignored)
#   bash scripts/gpu_session.sh device    there, from the repository root, with .gpu/ carried
#
# `prepare` builds the release wheel (CUDA on, with the kernel timing of `bench-internals`) and the
# core's unit tests with the `cuda` feature (release, stripped; every Rust test with device cases
# is among them). `device` installs the wheel beside the machine's own packages, then runs, each
# bounded in time and each one's output kept under $OUT (or .gpu/out): the Rust unit tests (the
# device cases, and the emulator's random plans compared on the device), test_cuda.py, the rest
# of the Python suite that needs neither Polars nor DataFusion, and benches/gpu.py with and
# without --uploads. A failing step does not stop the later ones; the exit status says whether
# any failed. On a machine without a GPU `device` stops at once, saying so.
set -uo pipefail
cd "$(dirname "$0")/.."

prepare() {
  set -e
  rm -rf .gpu
  mkdir -p .gpu/bin
  (
    cd python
    VIRTUAL_ENV="$PWD/../.venv" PATH="$PWD/../.venv/bin:$PATH" CARGO_TARGET_DIR="$PWD/../target" \
      CARGO_INCREMENTAL=0 ../.venv/bin/maturin build --release --quiet --features bench-internals -o ../.gpu
  )
  CARGO_INCREMENTAL=0 cargo test -p dlframe --features cuda --release --lib --no-run --message-format=json \
    | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' \
    | while read -r exe; do
      cp "$exe" .gpu/bin/dlframe-unit
      strip .gpu/bin/dlframe-unit
    done
  test -x .gpu/bin/dlframe-unit
  local size
  size=$(du -sm .gpu | cut -f1)
  echo "prepared .gpu/ ($size MiB): $(ls .gpu | tr '\n' ' ')"
  # The device tool carries at most 64 MiB, the working tree included.
  if [ "$size" -gt 56 ]; then
    echo "too large to carry with the working tree (64 MiB in all)" >&2
    exit 1
  fi
}

device() {
  local out="${OUT:-.gpu/out}" failed=0
  mkdir -p "$out"
  if ! nvidia-smi -L >"$out/gpu.txt" 2>&1; then
    echo "no GPU here (nvidia-smi -L failed): nothing to run" | tee -a "$out/gpu.txt"
    return 1
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$out/gpu.txt"
  date -u >>"$out/gpu.txt"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/dlframe-site \
    .gpu/dlframe-*.whl || return 1
  export PYTHONPATH=/tmp/dlframe-site PYTHONUNBUFFERED=1
  # NVRTC, which compiles the kernels at their first launch: the toolkit's, or the one pip put
  # beside torch, wherever the loader would not find it by itself.
  local nvrtc
  nvrtc=$(python3 -c 'import glob, os, site
for d in ["/usr/local/cuda/lib64", *site.getsitepackages()]:
    hits = glob.glob(os.path.join(d, "**", "libnvrtc.so*"), recursive=True)
    if hits:
        print(os.path.dirname(hits[0]))
        break')
  if [ -n "$nvrtc" ]; then
    export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  echo "NVRTC from: ${nvrtc:-the default library search}" | tee -a "$out/gpu.txt"
  # Each step: a name, a time limit in seconds, the command; its output in $out/<name>.log.
  step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    tail -n 4 "$out/$name.log"
    echo "== $name: exit $rc"
    [ "$rc" -eq 0 ] || failed=1
  }
  step rust 240 .gpu/bin/dlframe-unit
  step test_cuda 180 python3 -m pytest -q -ra -p no:cacheprovider python/tests/test_cuda.py
  # Every other test file that imports neither Polars nor DataFusion (absent there).
  local others
  others=$(grep -L -E '^ *(import|from) +(polars|datafusion)' python/tests/test_*.py | grep -v test_cuda.py)
  # shellcheck disable=SC2086
  step python 240 python3 -m pytest -q -ra -p no:cacheprovider $others
  step gpu_bench 180 python3 benches/gpu.py
  step gpu_uploads 120 python3 benches/gpu.py --uploads
  return "$failed"
}

case "${1:-}" in
  prepare) prepare ;;
  device) device ;;
  *)
    echo "usage: bash scripts/gpu_session.sh prepare|device" >&2
    exit 2
    ;;
esac
