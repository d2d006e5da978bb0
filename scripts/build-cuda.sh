#!/usr/bin/env bash
# Builds the CUDA binary (and the test binaries that scripts/gpu-tests.sh runs) on a machine with
# no GPU, no CUDA toolkit and no root: CUDA 13.0 from PyPI into .cuda/, a link-time stand-in for
# the driver library, `cargo build --release --features cuda` into target-cuda/, then the binary,
# the device tests and the encoder bench stripped and packed into .cuda/carry/benign-cuda.tar.xz
# for a GPU machine (scripts/gpu-tests.sh and scripts/gpu-bench.sh there; see docs/cuda.md).
# Re-running skips what is already there.
#
# Environment: JOBS (cargo -j), CUDAFORGE_THREADS (parallel nvcc runs of candle-kernels' build;
# all cores when unset), CUDA_COMPUTE_CAP (default 90: H100/H200).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cuda_dir=$root/.cuda
toolkit=$cuda_dir/nvidia/cu13
target_dir=$root/target-cuda
carry=$cuda_dir/carry

die() { echo "build-cuda.sh: $*" >&2; exit 1; }
step() { echo "== $*" >&2; }

# CUDA 13.0.x only: the GPU machines run driver 580 and nvcc 13.0, and PTX from a newer nvcc may
# not load there. Each is the newest 13.0 release on PyPI (`pip index versions NAME`); curand's
# 10.4.0 and cublas's 13.0 are the versions shipped with CUDA 13.0.
packages=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-nvvm==13.0.88 # nvcc's cicc
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-cublas==13.0.2.14
  nvidia-curand==10.4.0.35
  nvidia-cuda-nvrtc==13.0.88
)

for tool in cargo python3 gcc strip xz tar ldd; do
  command -v "$tool" >/dev/null || die "$tool not found on PATH"
done
python3 -m pip --version >/dev/null 2>&1 || die "python3 has no pip (needed to fetch CUDA from PyPI)"

# 1. The toolkit pieces, in one pip run (several --target runs into one nvidia/ folder would skip
# each other's files).
stamp=$cuda_dir/installed.txt
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${packages[*]}" ] && [ -x "$toolkit/bin/nvcc" ]; then
  step "CUDA 13.0 pieces already in $cuda_dir"
else
  step "installing ${packages[*]} into $cuda_dir"
  rm -rf "$cuda_dir/nvidia" "$stamp"
  mkdir -p "$cuda_dir"
  python3 -m pip install --quiet --no-deps --only-binary=:all: --disable-pip-version-check \
    --target "$cuda_dir" "${packages[@]}" || die "pip install failed (network? versions?)"
  echo "${packages[*]}" >"$stamp"
fi
for f in bin/nvcc nvvm/bin/cicc include/cuda_runtime.h include/crt/host_config.h \
  include/cccl/cuda/std/type_traits lib/libcudart.so.13 lib/libcublas.so.13 lib/libcublasLt.so.13 \
  lib/libcurand.so.10 lib/libnvrtc.so.13; do
  [ -e "$toolkit/$f" ] || die "$toolkit/$f missing after the install (wheel layout changed?)"
done

# 2. Unversioned names beside the versioned libraries, for the linker's -lcudart etc.
for lib in "$toolkit"/lib/lib*.so.*; do
  base=${lib%%.so.*}.so
  [ -e "$base" ] || ln -s "$(basename "$lib")" "$base"
done

# 3. libcuda: candle 0.11 turns on cudarc's `dynamic-linking` (not `dynamic-loading`), so the
# binary is linked against libcuda.so and records libcuda.so.1 as NEEDED. The real one comes with
# the NVIDIA driver, which this machine lacks: the linker gets a stand-in with one empty function
# per driver symbol that cudarc names. It is never loaded: at run time the driver's libcuda.so.1 is
# found instead (it is not on any run-time path we set).
cudarc_version=$(awk '/^name = "cudarc"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
[ -n "$cudarc_version" ] || die "no cudarc in Cargo.lock"
stub=$toolkit/lib/stubs/libcuda.so
if [ -f "$stub" ] && [ "$(cat "$cuda_dir/libcuda_stub.version" 2>/dev/null)" = "$cudarc_version" ]; then
  step "driver stand-in already at $stub"
else
  cargo fetch --quiet || die "cargo fetch failed"
  cargo_home=${CARGO_HOME:-$HOME/.cargo}
  sys=$(ls -d "$cargo_home"/registry/src/*/cudarc-"$cudarc_version"/src/driver/sys 2>/dev/null | head -1)
  [ -n "$sys" ] || die "cudarc $cudarc_version sources not found under $cargo_home/registry/src"
  mkdir -p "$(dirname "$stub")"
  grep -rhoE 'fn cu[A-Za-z0-9_]+\(' "$sys" | sed -E 's/^fn //; s/\($//' | sort -u |
    awk '{ printf "int %s(void) { return 34; /* CUDA_ERROR_STUB_LIBRARY */ }\n", $1 }' >"$cuda_dir/libcuda_stub.c"
  count=$(wc -l <"$cuda_dir/libcuda_stub.c")
  [ "$count" -gt 100 ] || die "only $count cu* functions found in $sys"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub" "$cuda_dir/libcuda_stub.c"
  echo "$cudarc_version" >"$cuda_dir/libcuda_stub.version"
  step "driver stand-in: $count symbols from cudarc $cudarc_version -> $stub"
fi

# 4. The build, in its own target dir so that the CPU build's is untouched.
export CUDA_ROOT=$toolkit CUDA_HOME=$toolkit
export PATH=$toolkit/bin:$PATH
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
nvcc --version | tail -2 >&2
cargo_args=(--release --features cuda --target-dir "$target_dir" ${JOBS:+-j "$JOBS"})
step "cargo build ${cargo_args[*]}"
start=$SECONDS
cargo build "${cargo_args[@]}" || die "cargo build --features cuda failed"
# The device-parameterised tests and the encoder bench, as binaries (the GPU machines have no
# Rust toolchain).
tests=(encoder_parity last_layer_equivalence fused_attention phase2)
benches=(encoder stack)
test_flags=()
for t in "${tests[@]}"; do test_flags+=(--test "$t"); done
for b in "${benches[@]}"; do test_flags+=(--bench "$b"); done
cargo test "${cargo_args[@]}" --no-run --message-format=json "${test_flags[@]}" >"$cuda_dir/tests.json" ||
  die "cargo test --no-run --features cuda failed"
step "built in $((SECONDS - start)) s"

# 5. Stripped copies (redone when their build is newer), packed with xz: python3's tarfile
# unpacks it on a machine without the xz tool.
mkdir -p "$carry/bin"
binary=$target_dir/release/benign-attention
built=$(python3 - "$cuda_dir/tests.json" "${tests[@]}" "${benches[@]}" <<'EOF'
import json, sys
wanted, found = sys.argv[2:], {}
for line in open(sys.argv[1]):
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable"):
        found[msg["target"]["name"]] = msg["executable"]
for name in wanted:
    print(name, found.get(name, "-"))
EOF
)
while read -r name exe; do
  [ -f "$exe" ] || die "no built binary for $name"
  [ "$carry/bin/$name" -nt "$exe" ] || strip -o "$carry/bin/$name" "$exe"
done <<<"benign-attention $binary
$built"
tarball=$carry/benign-cuda.tar.xz
if [ ! -f "$tarball" ] || [ -n "$(find "$carry/bin" -newer "$tarball")" ]; then
  tar -C "$carry" -cf - bin | xz -9 -T1 >"$tarball.tmp" && mv "$tarball.tmp" "$tarball"
fi
size() { stat -c %s "$1" | awk '{ printf "%.1f MiB", $1 / 1048576 }'; }
echo "binary: raw $(size "$binary"), stripped $(size "$carry/bin/benign-attention")" >&2
for t in "${tests[@]}" "${benches[@]}"; do echo "$t: stripped $(size "$carry/bin/$t")" >&2; done
echo "packed: $(size "$tarball") in $tarball (a GPU-machine call carries 64 MiB)" >&2
# libcuda.so.1 is "not found" on a machine without the driver; the others resolve in .cuda/.
LD_LIBRARY_PATH=$toolkit/lib ldd "$carry/bin/benign-attention" || true
