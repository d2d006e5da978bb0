#!/usr/bin/env bash
# ON A GPU MACHINE, with the pack that scripts/gpu-tests.sh runs (see there): the encoder bench on
# GPU 0 beside its PyTorch baseline (scripts/bench_torch.py --device cuda) on the same inputs,
# then README's main command with `--device cuda` (the backbone on GPU 0, the phases on the host's
# cores) from a cold feature cache and again warm, the same machine's CPU-only run cold and warm
# (issue 64's ratios: cuda cold ≤ ¼ of CPU cold, cuda warm ≤ CPU warm), and a warm run with
# `--train-device cuda` (the phases on the GPU too); then the stack bench: five runs as one stack
# on the GPU's resident route against the host pass on this machine's cores. Needs
# BENIGN_DATA_DIR (cifar10/) and BENIGN_MODELS_DIR (the ViT-Ti; all-MiniLM-L6-v2 for the bench's
# last row). Usage: scripts/gpu-bench.sh OUT_DIR [encoder] [main] [stack]   (logs and summaries land in
# OUT_DIR; the parts named run, both when none is named)
# Each step has its own time limit (STEP_LIMIT_S, default 240 s), so that one slow step leaves
# the others their turn on a lease of minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-bench.sh OUT_DIR [encoder] [main] [stack]}
shift
parts=" ${*:-encoder main stack} "
mkdir -p "$out"
. scripts/gpu-env.sh
limit=${STEP_LIMIT_S:-240}
: "${BENIGN_DATA_DIR:?set BENIGN_DATA_DIR}" "${BENIGN_MODELS_DIR:?set BENIGN_MODELS_DIR}"
# The hub is out of reach there: the backbone list's first entry (the paper's ViT-B) is skipped
# at once instead of asked for.
export HF_HUB_OFFLINE=1
gpu_cache=$(mktemp -d) cpu_cache=$(mktemp -d)

main_command() { # $1: a label; $2: the feature cache; the rest: device flags
  local label=$1 cache=$2
  shift 2
  local started=$(date +%s%N)
  BENIGN_CACHE_DIR=$cache timeout "$limit" "$unpacked/bin/benign-attention" finetune \
    --dataset cifar10 --eta 0.2 --out "$out/run-$label" "$@" \
    >"$out/stdout-$label.txt" 2>"$out/finetune-$label.log"
  local status=$?
  local ms=$((($(date +%s%N) - started) / 1000000))
  echo "main command, $label ($*): exit $status, $((ms / 1000)).$(printf %03d $((ms % 1000))) s wall"
  tail -2 "$out/finetune-$label.log"
}

if [[ $parts == *" encoder "* ]]; then
  echo "== encoder bench on cuda (candle)"
  BENIGN_BENCH_DEVICE=cuda timeout "$limit" "$unpacked/bin/encoder" | tee "$out/encoder-candle.md"
  echo "== the same on cuda (PyTorch)"
  models=vit_tiny_patch16_224,vit_base_patch16_224_random
  [ -d "$BENIGN_MODELS_DIR/sentence-transformers/all-MiniLM-L6-v2" ] && models+=,all_minilm_l6_v2
  timeout "$limit" python3 scripts/bench_torch.py --device cuda --models "$models" | tee "$out/encoder-torch.jsonl"
fi
if [[ $parts == *" main "* ]]; then
  main_command cuda-cold "$gpu_cache" --device cuda
  main_command cuda-warm "$gpu_cache" --device cuda
  main_command cpu-cold "$cpu_cache"
  main_command cpu-warm "$cpu_cache"
  main_command cuda-train-warm "$gpu_cache" --device cuda --train-device cuda
  # The GPU-made features against the CPU-made ones, through the runs they gave.
  for label in cuda-warm cuda-train-warm; do
    cmp -s "$out/run-cpu-warm/metrics.jsonl" "$out/run-$label/metrics.jsonl" &&
      echo "$label: the CPU run's metrics.jsonl, byte for byte" ||
      echo "$label: metrics.jsonl differs from the CPU run's (summary.json: final and baseline beside each other)"
  done
fi
if [[ $parts == *" stack "* ]]; then
  echo "== stack bench: the resident route on cuda against the host pass (ViT-Ti, ViT-B size with random weights)"
  BENIGN_BENCH_DEVICE=cuda timeout "$limit" "$unpacked/bin/stack" | tee "$out/stack.md"
fi
