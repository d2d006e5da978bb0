#!/usr/bin/env bash
# Compares `benign-attention data split --rng authors` with real numpy + torch evaluating the
# authors' own lines (scripts/authors_rng_fixtures.py --case), index for index and label for label.
#
#   scripts/authors_split_check.sh PYTHON DATASET P N ETA SEED
#
# PYTHON: an interpreter with numpy 2.2.3 and torch 2.6.0 (see scripts/authors_rng_fixtures.py);
# DATASET: trec, breastmnist or mnist; the data root is $BENIGN_DATA_DIR. Exits 0 when both agree.
set -euo pipefail
[ $# -eq 6 ] || { echo "usage: $0 PYTHON DATASET P N ETA SEED" >&2; exit 2; }
python=$1 dataset=$2 p=$3 n=$4 eta=$5 seed=$6
: "${BENIGN_DATA_DIR:?set BENIGN_DATA_DIR to the folder holding the release files}"
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" scripts/authors_rng_fixtures.py --data-dir "$BENIGN_DATA_DIR" \
  --case "$dataset,$p,$n,$eta,$seed" > "$work/torch.json"
cargo run --release --quiet -- data split --rng authors --dataset "$dataset" --pretrain-n "$p" \
  --n "$n" --eta "$eta" --seed "$seed" --out "$work/ours.json" > /dev/null
"$python" - "$work/torch.json" "$work/ours.json" <<'PY'
import json, sys
theirs, ours = (json.load(open(f)) for f in sys.argv[1:3])
keys = ["pretrain_indices", "finetune_indices", "finetune_clean_labels", "finetune_labels", "noisy_mask"]
bad = [k for k in keys if theirs[k] != ours[k]]
flipped = sum(theirs["noisy_mask"])
print("%s P %d n %d eta %s seed %d: %s (%d of %d labels flipped; numpy %s, torch %s)" % (
    theirs["dataset"], theirs["P"], theirs["n"], theirs["eta"], theirs["seed"],
    "differ in " + ", ".join(bad) if bad else "identical", flipped, theirs["n"],
    theirs["versions"]["numpy"], theirs["versions"]["torch"]))
sys.exit(1 if bad else 0)
PY
