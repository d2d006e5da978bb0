#!/usr/bin/env bash
# Runs the speed benches and prints the Markdown rows that docs/performance.md holds.
# Run on an otherwise idle machine; each bench measures its own baseline in the same process.
#   scripts/bench.sh            # default run + full 39×39 grid (about 10 minutes on 2 cores)
#   BENCH_GRID=coarse scripts/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --bench synthetic
cargo bench --bench synthetic_grid
# needs BENIGN_DATA_DIR (the data mirror)
cargo bench --bench data_load
# need BENIGN_MODELS_DIR (the checkpoint mirror)
cargo bench --bench encoder
cargo bench --bench phase2
