#!/usr/bin/env python3
"""Write tests/fixtures/tiny_timm_vit/ and tiny_timm_vit_io.safetensors from REAL timm, and
tests/fixtures/tiny_vit_bin/pytorch_model.bin from real torch.

A tiny ViT with random weights (32x32 input, 16x16 patches, width 24, 2 blocks, 3 heads), saved in
timm's own hub format: config.json as timm writes it for the hub (architecture, num_classes,
num_features, global_pool, pretrained_cfg, model_args) and model.safetensors with timm's tensor
names (fused attn.qkv). The io file holds a fixed input and timm's own outputs for it
(`forward_features`: the final LayerNorm's tokens; and every block's output), which
tests/encoder_parity.rs compares with the crate's native loading of the same files. Random weights
serve parity only: this is not a pretrained backbone.

    python3 -m venv /tmp/timm-venv && /tmp/timm-venv/bin/pip install torch timm safetensors
    /tmp/timm-venv/bin/python scripts/timm_fixtures.py

Deterministic: the same files on every run with the same timm and torch versions.
"""
import json
import os

import timm
import torch
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures")

torch.manual_seed(0)
args = dict(img_size=32, patch_size=16, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=5,
            qkv_bias=True)
model = VisionTransformer(**args).eval()
# timm zero-initialises some biases and the head; randomise everything so that a wrong mapping shows.
with torch.no_grad():
    for p in model.parameters():
        p.copy_(torch.randn_like(p) * 0.2)

folder = os.path.join(OUT, "tiny_timm_vit")
os.makedirs(folder, exist_ok=True)
config = {
    "architecture": "vit_tiny_patch16_224",
    "num_classes": args["num_classes"],
    "num_features": args["embed_dim"],
    "global_pool": "token",
    "model_args": {k: v for k, v in args.items() if k != "num_classes"},
    "pretrained_cfg": {
        "tag": "fixture",
        "input_size": [3, args["img_size"], args["img_size"]],
        "interpolation": "bicubic",
        "crop_pct": 0.9,
        "mean": [0.5, 0.5, 0.5],
        "std": [0.5, 0.5, 0.5],
        "num_classes": args["num_classes"],
        "first_conv": "patch_embed.proj",
        "classifier": "head",
    },
}
with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(folder, "model.safetensors"))

pixels = torch.randn(2, 3, args["img_size"], args["img_size"], generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    x = model.patch_embed(pixels)
    x = model._pos_embed(x)
    outputs = {"pixel_values": pixels, "hidden_states.0": x.clone()}
    for i, block in enumerate(model.blocks):
        x = block(x)
        outputs[f"hidden_states.{i + 1}"] = x.clone()
    outputs["last_hidden_state"] = model.forward_features(pixels)
save_file({k: v.contiguous() for k, v in outputs.items()}, os.path.join(OUT, "tiny_timm_vit_io.safetensors"),
          metadata={"timm": timm.__version__, "torch": torch.__version__})
print("wrote tests/fixtures/tiny_timm_vit/ and tiny_timm_vit_io.safetensors with timm", timm.__version__)

# tiny_vit's Hugging Face weights as an older checkpoint holds them: pytorch_model.bin, written by
# torch.save (a zip of the tensors and a pickle), for the test that such weights load and give the
# same hidden states (tests/encoder_parity.rs).
from safetensors.torch import load_file

state = load_file(os.path.join(OUT, "tiny_vit", "model.safetensors"))
bin_folder = os.path.join(OUT, "tiny_vit_bin")
os.makedirs(bin_folder, exist_ok=True)
torch.save(state, os.path.join(bin_folder, "pytorch_model.bin"))
print("wrote tests/fixtures/tiny_vit_bin/pytorch_model.bin with torch", torch.__version__)
