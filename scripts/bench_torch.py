#!/usr/bin/env python3
"""PyTorch baseline for the Rust (candle) throughput bench, on the CPU or GPU 0.

Times forward passes of the Hugging Face `transformers` models that the Rust
crate re-implements, on the same deterministic inputs the Rust bench builds,
so the two can be compared on one machine:

  vit_tiny_patch16_224         ViTModel, real weights from
                               $BENIGN_MODELS_DIR/timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k,
                               batch 16 x 3 x 224 x 224                      -> images/s
  vit_base_patch16_224_random  ViTModel(ViTConfig()) = ViT-B/16, random weights
                               (add_pooling_layer=False), batch 16            -> images/s
  all_minilm_l6_v2             BertModel, real weights from
                               $BENIGN_MODELS_DIR/sentence-transformers/all-MiniLM-L6-v2,
                               batch 32 x 128 tokens, all attended           -> sentences/s

Inputs (integer arithmetic, then f32):
  pixel_values[b,c,y,x] = ((b*7 + c*3 + y + 2*x) % 255) / 127.5 - 1
  input_ids[b,t]        = 1000 + (b*131 + t*17) % 20000
  attention_mask = 1, token_type_ids = 0

Settings: torch.set_num_threads(--threads, default os.cpu_count()), eval mode,
torch.inference_mode(), --dtype float32 (default) or bfloat16 (the model's weights and
inputs cast, oneDNN's bf16 kernels on a CPU that has them), --attn eager (default) or sdpa
(attn_implementation; with bf16, SDPA is PyTorch's fastest CPU path). Two warm-up
iterations, then the median of --iters (>= 5) timed iterations. With
--device cuda, model and inputs live on GPU 0, each iteration is timed until
torch.cuda.synchronize(), and f32 products stay IEEE f32 (no TF32), as
candle's do by default.

Then (--large-product, default on) one line for a 2048 x 2048 x 2048 torch.matmul in the same
dtype and threads: {"model": "large_product_2048", "macs_per_second", ...}, the library's own
limit beside which the models' rates read.

Prints one JSON line per model:
  {"model", "batch", "seconds_per_batch", "items_per_second", "threads", "torch", ...}
`cpu_per_wall` (process CPU seconds per wall second over the timed iterations)
shows contention: it should be close to `threads`; if it is much lower, other
work was competing for the cores and the numbers are not a clean baseline.

Usage:
  BENIGN_MODELS_DIR=... /tmp/parity-venv/bin/python scripts/bench_torch.py \\
      [--threads N] [--iters K] [--device cpu|cuda] [--models vit_tiny_patch16_224,all_minilm_l6_v2]
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import BertModel, ViTConfig, ViTModel

transformers.logging.set_verbosity_error()  # the ViT-Ti checkpoint carries unused classifier.* keys

WARMUP = 2


def models_dir() -> Path:
    value = os.environ.get("BENIGN_MODELS_DIR")
    if not value:
        sys.exit("error: environment variable BENIGN_MODELS_DIR is not set (it must point at the offline model mirror)")
    path = Path(value)
    if not path.is_dir():
        sys.exit(f"error: BENIGN_MODELS_DIR={value} is not a directory")
    return path


def pixel_values(batch: int, channels: int = 3, size: int = 224) -> torch.Tensor:
    b = torch.arange(batch, dtype=torch.int64).view(-1, 1, 1, 1)
    c = torch.arange(channels, dtype=torch.int64).view(1, -1, 1, 1)
    y = torch.arange(size, dtype=torch.int64).view(1, 1, -1, 1)
    x = torch.arange(size, dtype=torch.int64).view(1, 1, 1, -1)
    v = (b * 7 + c * 3 + y + 2 * x) % 255
    return (v.to(torch.float32) / 127.5 - 1.0).contiguous()


def text_inputs(batch: int, seq_len: int) -> dict:
    b = torch.arange(batch, dtype=torch.int64).view(-1, 1)
    t = torch.arange(seq_len, dtype=torch.int64).view(1, -1)
    input_ids = 1000 + (b * 131 + t * 17) % 20000
    return {
        "input_ids": input_ids.contiguous(),
        "attention_mask": torch.ones((batch, seq_len), dtype=torch.int64),
        "token_type_ids": torch.zeros((batch, seq_len), dtype=torch.int64),
    }


def load_vit_tiny(attn: str):
    path = models_dir() / "timm" / "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    return ViTModel.from_pretrained(
        str(path), add_pooling_layer=False, attn_implementation=attn, torch_dtype=torch.float32
    )


def load_vit_base_random(attn: str):
    torch.manual_seed(0)
    config = ViTConfig()  # hidden 768, 12 layers, 12 heads, 224 px, patch 16
    config._attn_implementation = attn
    return ViTModel(config, add_pooling_layer=False)


def load_minilm(attn: str):
    path = models_dir() / "sentence-transformers" / "all-MiniLM-L6-v2"
    return BertModel.from_pretrained(str(path), attn_implementation=attn, torch_dtype=torch.float32)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# name -> (loader, batch, input builder, input description)
MODELS = {
    "vit_tiny_patch16_224": (load_vit_tiny, 16, lambda: {"pixel_values": pixel_values(16)}, [16, 3, 224, 224]),
    "vit_base_patch16_224_random": (
        load_vit_base_random, 16, lambda: {"pixel_values": pixel_values(16)}, [16, 3, 224, 224]),
    "all_minilm_l6_v2": (load_minilm, 32, lambda: text_inputs(32, 128), [32, 128]),
}


def bench(name: str, iters: int, threads: int, device: str, dtype: str, attn: str) -> dict:
    loader, batch, make_inputs, shape = MODELS[name]
    model = loader(attn).eval().to(device=device, dtype=DTYPES[dtype])
    assert model.config._attn_implementation == attn, model.config._attn_implementation
    inputs = {
        key: value.to(device=device, dtype=DTYPES[dtype]) if value.is_floating_point() else value.to(device)
        for key, value in make_inputs().items()
    }
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    cpu = 0.0
    with torch.inference_mode():
        for i in range(WARMUP + iters):
            start, cpu_start = time.perf_counter(), time.process_time()
            model(**inputs)
            sync()
            elapsed, cpu_used = time.perf_counter() - start, time.process_time() - cpu_start
            if i >= WARMUP:
                times.append(elapsed)
                cpu += cpu_used
    seconds = statistics.median(times)
    return {
        "model": name,
        "batch": batch,
        "input_shape": shape,
        "seconds_per_batch": round(seconds, 6),
        "items_per_second": round(batch / seconds, 3),
        "threads": threads,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "iters": iters,
        # CPU seconds this process used per wall second while timed: close to `threads` on an
        # idle machine, well below it when other work competes for the cores.
        "cpu_per_wall": round(cpu / sum(times), 2),
        "dtype": dtype,
        "attn": attn,
        "torch": torch.__version__,
    }


def large_product(iters: int, threads: int, device: str, dtype: str) -> dict:
    side = 2048
    values = ((torch.arange(side * side) * 37 % 101).to(torch.float32) - 50.0) / 50.0
    a = values.view(side, side).to(device=device, dtype=DTYPES[dtype])
    b = a.t().contiguous()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    with torch.inference_mode():
        for i in range(WARMUP + iters):
            start = time.perf_counter()
            torch.matmul(a, b)
            sync()
            if i >= WARMUP:
                times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return {
        "model": f"large_product_{side}",
        "seconds": round(seconds, 6),
        "macs_per_second": round(side**3 / seconds),
        "threads": threads,
        "dtype": dtype,
        "torch": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: os.cpu_count())")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the models run (default: cpu)")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations, median reported (>= 5)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32", help="weights and inputs (default: float32)")
    parser.add_argument("--attn", choices=["eager", "sdpa"], default="eager", help="attn_implementation (default: eager)")
    parser.add_argument("--no-large-product", action="store_true", help="skip the 2048^3 matmul line")
    parser.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"comma-separated subset of: {', '.join(MODELS)} (default: all)",
    )
    args = parser.parse_args()
    if args.iters < 5:
        parser.error("--iters must be >= 5")
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown or not names:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")

    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("error: --device cuda: PyTorch sees no GPU")
        # IEEE f32 products, as candle's cuBLAS calls make them unless told otherwise.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    for name in names:
        print(json.dumps(bench(name, args.iters, args.threads, args.device, args.dtype, args.attn)), flush=True)
    if not args.no_large_product:
        print(json.dumps(large_product(args.iters, args.threads, args.device, args.dtype)), flush=True)


if __name__ == "__main__":
    main()
