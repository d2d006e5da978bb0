"""Writes PyTorch's f32 and bf16 CLS features of ViT-Ti/16 and all-MiniLM-L6-v2, for tests/bf16_parity.rs.

What: the real checkpoints, run by transformers' own ViTModel and BertModel twice each, once in
float32 with attn_implementation="eager" (the f32 reference) and once in bfloat16
(`model.to(torch.bfloat16)`, pixel inputs cast to bf16) with attn_implementation="sdpa" (PyTorch's
fast bf16 CPU path, where every activation is kept in bf16). The Rust test checks that
`--precision bf16` (bf16 operands of the products only, activations in f32) is at least as close
to the f32 reference as PyTorch's own bf16 is.

Inputs, made by formula exactly as in benches/encoder.rs and scripts/bench_torch.py:
  ViT-Ti/16 ($BENIGN_MODELS_DIR/timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k), batch 4:
    pixel_values[b,c,y,x] = ((b*7 + c*3 + y + 2*x) % 255)/127.5 - 1, (4, 3, 224, 224)
  all-MiniLM-L6-v2 ($BENIGN_MODELS_DIR/sentence-transformers/all-MiniLM-L6-v2), batch 4 x 32:
    input_ids[b,t] = 1000 + (b*131 + t*17) % 20000, attention_mask = 1, token_type_ids = 0

Settings: torch.set_num_threads(1), eval mode, torch.inference_mode(), HF_HUB_OFFLINE=1.

Writes tests/fixtures/bf16_parity.safetensors, float32 tensors:
  vit.f32.last_hidden_state_cls, vit.bf16.last_hidden_state_cls  (4, 192): last_hidden_state[:, 0]
      (HF ViTModel's last_hidden_state is after the final layernorm)
  minilm.f32.cls, minilm.bf16.cls                                 (4, 384): last_hidden_state[:, 0]
and the torch and transformers versions in the file's metadata (keys sorted, so that a re-run on
the same machine writes the same bytes). Prints, per model, max |bf16 - f32| and the minimum
per-row cosine of bf16 against f32.

Versions the committed fixture was made with: torch 2.15.0+cu132 (run on the CPU),
transformers 4.51.3, safetensors 0.8.0, Python 3.11.7 (/tmp/parity-venv, scripts/requirements-parity.txt).

Usage:
  BENIGN_MODELS_DIR=/path/to/models /tmp/parity-venv/bin/python scripts/bf16_parity_fixture.py \\
      [--out tests/fixtures/bf16_parity.safetensors]
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import argparse
import json
import struct
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save
from transformers import BertModel, ViTModel

transformers.logging.set_verbosity_error()  # the ViT-Ti checkpoint carries unused classifier.* keys

BATCH = 4
SEQ_LEN = 32
VIT_ID = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"
MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"
# (precision name in the fixture, torch dtype, attn_implementation)
RUNS = (("f32", torch.float32, "eager"), ("bf16", torch.bfloat16, "sdpa"))


# The inputs and the models root as the PyTorch bench makes them (this file's folder is on sys.path
# when it runs as a script): the fixture's inputs are the benches' inputs by construction.
from bench_torch import models_dir, pixel_values, text_inputs  # noqa: E402


def cls(model_class, path: Path, inputs: dict, dtype: torch.dtype, attn: str, **kwargs) -> torch.Tensor:
    """last_hidden_state[:, 0] of the model at `path` in `dtype`, as float32."""
    model = model_class.from_pretrained(str(path), attn_implementation=attn, torch_dtype=torch.float32, **kwargs)
    model = model.eval().to(torch.bfloat16) if dtype == torch.bfloat16 else model.eval()
    assert model.config._attn_implementation == attn, model.config._attn_implementation
    cast = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.inference_mode():
        out = model(**cast).last_hidden_state
    assert out.dtype == dtype, out.dtype
    return out[:, 0].to(torch.float32).contiguous()


def report(name: str, f32: torch.Tensor, bf16: torch.Tensor) -> None:
    a, b = f32.double(), bf16.double()
    max_diff = (b - a).abs().max().item()
    cosine = ((a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))).min().item()
    print(f"{name}: shape {tuple(f32.shape)}, max |bf16 - f32| = {max_diff:.6g}, min row cosine = {cosine:.9f}")


def with_sorted_metadata(data: bytes) -> bytes:
    """The safetensors file `data` with its metadata keys in sorted order: safetensors writes them
    in a hash map's order, which varies from run to run, and the fixture should be byte-identical
    on re-run. The header keeps its length (the same keys, reordered), so the offsets still hold."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= length, (len(text), length)
    return data[:8] + text.ljust(length) + data[8 + length :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "bf16_parity.safetensors",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = models_dir()

    out = {}
    vit_inputs = {"pixel_values": pixel_values(BATCH)}
    for name, dtype, attn in RUNS:
        out[f"vit.{name}.last_hidden_state_cls"] = cls(
            ViTModel, root / VIT_ID, vit_inputs, dtype, attn, add_pooling_layer=False
        )
    minilm_inputs = text_inputs(BATCH, SEQ_LEN)
    for name, dtype, attn in RUNS:
        out[f"minilm.{name}.cls"] = cls(BertModel, root / MINILM_ID, minilm_inputs, dtype, attn)

    report("ViT-Ti/16", out["vit.f32.last_hidden_state_cls"], out["vit.bf16.last_hidden_state_cls"])
    report("all-MiniLM-L6-v2", out["minilm.f32.cls"], out["minilm.bf16.cls"])
    metadata = {"torch": torch.__version__, "transformers": transformers.__version__}
    args.out.write_bytes(with_sorted_metadata(save(out, metadata=metadata)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
