#!/usr/bin/env bash
# ON A GPU MACHINE (NVIDIA driver, python3 with PyTorch's CUDA 13 wheels; no Rust needed): runs the
# device-parameterised tests on GPU 0 from what scripts/build-cuda.sh packed elsewhere. Carry
# .cuda/carry with the working tree, then: scripts/gpu-tests.sh [test-harness args, e.g. a filter]
# The tests compare the GPU with the HF fixtures and the CPU (see tests/common/mod.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh

# The binaries find tests/fixtures through CARGO_MANIFEST_DIR, as under cargo.
export BENIGN_TEST_DEVICE=cuda CARGO_MANIFEST_DIR=$PWD
status=0
for t in encoder_parity last_layer_equivalence fused_attention phase2; do
  echo "== $t on cuda"
  "$unpacked/bin/$t" --test-threads 1 "$@" || status=1
done
exit $status
