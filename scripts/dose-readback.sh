#!/usr/bin/env bash
# The SNR dose read back by the estimate (docs/design.md, "The SNR dose"): `diagnose snr
# --token-noise k` for k in {0, 1, 3, 9} on a dataset's fine-tune set, one JSON line per dose
# into results/dose-readback/<dataset>_<mode>_n<n>.jsonl. The phase-1 classifier is shared by the
# doses (it reads the undosed pretrain tokens), so after the first dose each costs the estimate.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-target/release/benign-attention}
out=${OUT:-results/dose-readback}
mkdir -p "$out"
for spec in ${SPECS:-cifar10:head:1000 trec:head:1000}; do
  IFS=: read -r dataset mode n <<<"$spec"
  file="$out/${dataset}_${mode}_n${n}.jsonl"
  [ -s "$file" ] && continue
  : >"$file.part"
  for k in 0 1 3 9; do
    "$bin" diagnose snr --dataset "$dataset" --mode "$mode" --n "$n" --eta 0 --rng own \
      --token-noise "$k" >>"$file.part" 2>>"$file.err"
  done
  mv "$file.part" "$file"
  rm -f "$file.err"
done
