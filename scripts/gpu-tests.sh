#!/usr/bin/env bash
# ON A GPU MACHINE (NVIDIA driver, python3 with PyTorch's CUDA 13 wheels; no Rust needed): runs the
# device-parameterised tests on GPU 0 from what scripts/build-cuda.sh packed elsewhere. Carry
# .cuda/carry with the working tree, then: scripts/gpu-tests.sh [test-harness args, e.g. a filter]
# The tests compare the GPU with the HF fixtures and the CPU (see tests/common/mod.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
packed=.cuda/carry/benign-cuda.tar.xz
[ -f "$packed" ] || { echo "gpu-tests.sh: no $packed: run scripts/build-cuda.sh and carry .cuda/carry" >&2; exit 1; }
unpacked=$(mktemp -d)
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' "$packed" "$unpacked"

# libcudart, libcublas(Lt), libcurand and libnvrtc from the nvidia/*/lib folders of PyTorch's
# wheels; libcuda.so.1 is the driver's, already on the loader's path.
libs=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "*", "lib", "lib*.so*"))})))')
[ -n "$libs" ] || { echo "gpu-tests.sh: python3 has no nvidia/*/lib (PyTorch's CUDA wheels)" >&2; exit 1; }
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
ldd "$unpacked/bin/benign-attention" | grep -E 'libcuda|libcublas|libcurand|libcudart|libnvrtc|not found' || true
"$unpacked/bin/benign-attention" --version

# The binaries find tests/fixtures through CARGO_MANIFEST_DIR, as under cargo.
export BENIGN_TEST_DEVICE=cuda CARGO_MANIFEST_DIR=$PWD
status=0
for t in encoder_parity last_layer_equivalence fused_attention; do
  echo "== $t on cuda"
  "$unpacked/bin/$t" --test-threads 1 "$@" || status=1
done
exit $status
