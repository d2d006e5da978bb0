# Sourced by scripts/gpu-tests.sh and scripts/gpu-bench.sh ON A GPU MACHINE: unpacks the binaries
# that scripts/build-cuda.sh packed into a fresh folder, $unpacked/bin, and puts PyTorch's CUDA 13
# libraries on the loader's path (libcudart, libcublas(Lt), libcurand and libnvrtc from the
# nvidia/*/lib folders of python3's site-packages; libcuda.so.1 is the driver's, already there).
packed=.cuda/carry/benign-cuda.tar.xz
[ -f "$packed" ] || { echo "$0: no $packed: run scripts/build-cuda.sh and carry .cuda/carry" >&2; exit 1; }
unpacked=$(mktemp -d)
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' "$packed" "$unpacked"
libs=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "*", "lib", "lib*.so*"))})))')
[ -n "$libs" ] || { echo "$0: python3 has no nvidia/*/lib (PyTorch's CUDA wheels)" >&2; exit 1; }
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
ldd "$unpacked/bin/benign-attention" | grep -E 'libcuda|libcublas|libcurand|libcudart|libnvrtc|not found' || true
"$unpacked/bin/benign-attention" --version
