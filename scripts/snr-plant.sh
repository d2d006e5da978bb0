#!/usr/bin/env bash
# The planted-signal recovery curve (docs/design.md, "A planted signal"): `diagnose snr
# --plant-snr` on every Table 2 dataset in both modes at n 20, 200 and 1000 (where the training
# pool holds them), one JSON line per S into results/snr-plant/<dataset>_<mode>_n<n>.jsonl.
# Resumable: a file already written is kept. The fine-tune samples are the noise, so any honest
# split serves: the crate's own draw and one pretrain sample (the plant reads no phase 1); the
# classifier is fitted on the first 1000 test samples (all of a smaller test split), so larger
# test splits are subsampled to 1000.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-target/release/benign-attention}
out=${OUT:-results/snr-plant}
snrs=0.05,0.1,0.15,0.2,0.3,0.5,0.7,1.0
mkdir -p "$out"
for dataset in ${DATASETS:-breastmnist pneumoniamnist trec ag_news cifar10 mnist}; do
  case "$dataset" in
    ag_news) extra=(--carve-train-from-test 0.5 --test-n 1000) ;;
    cifar10 | mnist) extra=(--test-n 1000) ;;
    *) extra=() ;;
  esac
  for mode in head last-layer; do
    for n in ${NS:-20 200 1000}; do
      file="$out/${dataset}_${mode}_n${n}.jsonl"
      [ -s "$file" ] && continue
      if "$bin" diagnose snr --dataset "$dataset" --mode "$mode" --n "$n" --eta 0 --rng own \
        --pretrain-n 1 "${extra[@]}" --plant-snr "$snrs" >"$file.part" 2>"$file.err"; then
        mv "$file.part" "$file"
        rm -f "$file.err"
      else
        echo "$dataset $mode n $n: $(tail -1 "$file.err")" >&2
        rm -f "$file.part"
      fi
    done
  done
done
