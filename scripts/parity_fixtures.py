#!/usr/bin/env python3
"""Generate the Hugging Face parity fixtures in tests/fixtures/.

The Rust crate re-implements ViT, BERT, the ViT image preprocessing and the
BERT tokenization that the paper's authors ran through Hugging Face
`transformers` (their lock file pins transformers==4.51.3).  This script runs
the reference Python implementations once and writes small, deterministic
fixtures that Rust tests compare against:

  tiny_vit/                         random tiny ViTModel (config.json + model.safetensors)
  tiny_vit_io.safetensors           its input and every hidden state
  tiny_bert/                        random tiny BertModel with pooler
  tiny_bert_io.safetensors          its inputs (with padding), hidden states, pooler output
  image_preprocess.safetensors      ViTImageProcessor on two MNIST + two CIFAR-10 images
  trec_tokens.json                  BertTokenizerFast(bert-base-uncased) on TREC / AG-news texts
  README.md                         what each file holds

Inputs come only from the environment:
  BENIGN_DATA_DIR    offline data mirror (mnist/, cifar10/, trec/, ag_news/)
  BENIGN_MODELS_DIR  offline model mirror (google-bert/bert-base-uncased/)

Usage (from anywhere; the repository root is found from this file's location):
  python3 -m venv /tmp/parity-venv
  /tmp/parity-venv/bin/pip install -r scripts/requirements-parity.txt
  BENIGN_DATA_DIR=... BENIGN_MODELS_DIR=... /tmp/parity-venv/bin/python scripts/parity_fixtures.py

Running it twice gives byte-identical files (seeded RNG, one CPU thread).
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import csv
import gzip
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import PIL
import safetensors
import safetensors.numpy
import tokenizers
import torch
import transformers
from PIL import Image
from transformers import (
    BertConfig,
    BertModel,
    BertTokenizerFast,
    ViTConfig,
    ViTImageProcessor,
    ViTModel,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures"
SEED = 0
PERTURB_SCALE = 0.1


def env_dir(name: str) -> Path:
    value = os.environ.get(name)
    if not value:
        sys.exit(f"error: environment variable {name} is not set (it must point at the offline mirror)")
    path = Path(value)
    if not path.is_dir():
        sys.exit(f"error: {name}={value} is not a directory")
    return path


# --------------------------------------------------------------------------- models


def perturb_all_parameters(model: torch.nn.Module, seed: int) -> None:
    """Add PERTURB_SCALE * N(0,1) noise to every parameter, so that nothing keeps its
    trivial init value (LayerNorm weight 1 / bias 0, zero linear biases, ...)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            p.add_(PERTURB_SCALE * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def save_model(model: torch.nn.Module, out_dir: Path) -> None:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    # save_pretrained may drop a generation_config.json or similar for some models;
    # keep only what the Rust side reads.
    for f in out_dir.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            f.unlink()


def to_np(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().cpu().numpy())


def make_tiny_vit() -> None:
    torch.manual_seed(SEED)
    config = ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_act="gelu",
        layer_norm_eps=1e-6,  # not the ViTConfig default (1e-12): the Rust side must read it
        qkv_bias=True,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    config._attn_implementation = "eager"
    model = ViTModel(config, add_pooling_layer=False).eval()
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    perturb_all_parameters(model, seed=SEED + 1)

    gen = torch.Generator().manual_seed(SEED + 2)
    pixel_values = torch.randn((2, 3, 32, 32), generator=gen, dtype=torch.float32)
    with torch.no_grad():
        out = model(pixel_values=pixel_values, output_hidden_states=True)
    assert len(out.hidden_states) == config.num_hidden_layers + 1

    save_model(model, FIXTURES / "tiny_vit")
    tensors = {"pixel_values": to_np(pixel_values), "last_hidden_state": to_np(out.last_hidden_state)}
    for i, h in enumerate(out.hidden_states):
        tensors[f"hidden_states.{i}"] = to_np(h)
    safetensors.numpy.save_file(tensors, str(FIXTURES / "tiny_vit_io.safetensors"))


def make_tiny_bert() -> None:
    torch.manual_seed(SEED)
    config = BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        type_vocab_size=2,
        hidden_act="gelu",
        layer_norm_eps=1e-7,  # not the BertConfig default (1e-12)
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    config._attn_implementation = "eager"
    model = BertModel(config, add_pooling_layer=True).eval()
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    perturb_all_parameters(model, seed=SEED + 11)

    gen = torch.Generator().manual_seed(SEED + 12)
    input_ids = torch.randint(0, 64, (2, 16), generator=gen, dtype=torch.int64)
    attention_mask = torch.ones((2, 16), dtype=torch.int64)
    attention_mask[1, -5:] = 0  # second row: last 5 positions are padding
    token_type_ids = torch.zeros((2, 16), dtype=torch.int64)
    with torch.no_grad():
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            output_hidden_states=True,
        )
    assert len(out.hidden_states) == config.num_hidden_layers + 1

    save_model(model, FIXTURES / "tiny_bert")
    tensors = {
        "input_ids": to_np(input_ids),
        "attention_mask": to_np(attention_mask),
        "token_type_ids": to_np(token_type_ids),
        "pooler_output": to_np(out.pooler_output),
    }
    for i, h in enumerate(out.hidden_states):
        tensors[f"hidden_states.{i}"] = to_np(h)
    safetensors.numpy.save_file(tensors, str(FIXTURES / "tiny_bert_io.safetensors"))


# --------------------------------------------------------------------------- images


def read_mnist_images(path: Path, count: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        header = f.read(16)
        magic, n, rows, cols = np.frombuffer(header, dtype=">u4")
        assert magic == 2051, f"bad IDX magic {magic} in {path}"
        assert n >= count
        data = f.read(count * rows * cols)
    return np.frombuffer(data, dtype=np.uint8).reshape(count, rows, cols).copy()


def read_cifar_records(path: Path, count: int) -> np.ndarray:
    record = 1 + 3 * 1024
    with open(path, "rb") as f:
        data = f.read(count * record)
    assert len(data) == count * record
    arr = np.frombuffer(data, dtype=np.uint8).reshape(count, record)
    return arr[:, 1:].reshape(count, 3, 32, 32).copy()  # drop label byte; channels-first


RESAMPLES = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def make_image_preprocess(data_dir: Path) -> None:
    mnist = read_mnist_images(data_dir / "mnist" / "train-images-idx3-ubyte.gz", 2)
    cifar = read_cifar_records(data_dir / "cifar10" / "cifar-10-batches-bin" / "data_batch_1.bin", 2)
    images = {
        # The authors replicate grayscale to 3 channels before the processor.
        "mnist_0": (mnist[0], Image.fromarray(mnist[0], "L").convert("RGB")),
        "mnist_1": (mnist[1], Image.fromarray(mnist[1], "L").convert("RGB")),
        "cifar_0": (cifar[0], Image.fromarray(cifar[0].transpose(1, 2, 0), "RGB")),
        "cifar_1": (cifar[1], Image.fromarray(cifar[1].transpose(1, 2, 0), "RGB")),
    }

    tensors = {}
    for name, (raw, pil) in images.items():
        tensors[f"input.{name}"] = np.ascontiguousarray(raw)
        for rname, resample in RESAMPLES.items():
            processor = ViTImageProcessor(
                do_resize=True,
                size={"height": 224, "width": 224},
                resample=resample,
                do_rescale=True,
                rescale_factor=1 / 255,
                do_normalize=True,
                image_mean=[0.5, 0.5, 0.5],
                image_std=[0.5, 0.5, 0.5],
            )
            pixel_values = processor(images=pil, return_tensors="np")["pixel_values"]
            assert pixel_values.shape == (1, 3, 224, 224) and pixel_values.dtype == np.float32
            pixel_values = pixel_values[0]

            # The exact call transformers.image_transforms.resize makes: the PIL image goes
            # through np.asarray (uint8, HWC) and back to PIL unchanged (uint8 input is not
            # rescaled), then `image.resize((width, height), resample=resample,
            # reducing_gap=None)` on the uint8 RGB image, then np.array(...).
            resized = np.array(pil.resize((224, 224), resample=resample, reducing_gap=None))
            assert resized.shape == (224, 224, 3) and resized.dtype == np.uint8

            # Claimed relation, to 1e-6 ...
            approx = ((resized.astype(np.float64) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
            err = float(np.abs(approx - pixel_values).max())
            assert err <= 1e-6, f"{name}/{rname}: processor differs from PIL resize by {err}"
            # ... and bit-for-bit with the processor's own arithmetic: rescale is
            # (u8 as f64 * (1/255)) cast to f32, normalise is (x - 0.5f32) / 0.5f32 in f32.
            rescaled = (resized.astype(np.float64) * (1 / 255)).astype(np.float32)
            exact = ((rescaled - np.float32(0.5)) / np.float32(0.5)).transpose(2, 0, 1)
            assert np.array_equal(exact, pixel_values), f"{name}/{rname}: not bit-identical"

            tensors[f"resized.{rname}.{name}"] = np.ascontiguousarray(resized)
            tensors[f"pixel_values_crop.{rname}.{name}"] = np.ascontiguousarray(
                pixel_values[:, 100:116, 100:116]
            )
    safetensors.numpy.save_file(tensors, str(FIXTURES / "image_preprocess.safetensors"))


# --------------------------------------------------------------------------- text

TREC_LINES = [1, 2, 3, 4, 66]


def make_trec_tokens(data_dir: Path, models_dir: Path) -> None:
    tokenizer = BertTokenizerFast.from_pretrained(str(models_dir / "google-bert" / "bert-base-uncased"))

    with open(data_dir / "trec" / "train_5500.label", "rb") as f:
        trec_lines = f.read().decode("latin-1").split("\n")
    with open(data_dir / "ag_news" / "test.csv", newline="", encoding="utf-8") as f:
        cls, title, description = next(csv.reader(f))
    ag_text = title + " " + description

    entries = []
    for n in TREC_LINES:
        line = trec_lines[n - 1]
        text = line.split(" ", 1)[1]
        entries.append({"source": f"trec train line {n}", "line": n, "text": text})
    entries.append({"source": "ag_news test row 1", "line": 1, "text": ag_text})
    entries.append(
        {"source": "ag_news test row 1, text repeated 10 times (joined by a space)", "line": 1,
         "text": " ".join([ag_text] * 10)}
    )

    for e in entries:
        for suffix, special in (("", False), ("_special", True)):
            enc = tokenizer(
                e["text"],
                padding="max_length",
                max_length=128,
                truncation=True,
                add_special_tokens=special,
            )
            assert len(enc["input_ids"]) == 128 and len(enc["attention_mask"]) == 128
            e[f"input_ids{suffix}"] = list(enc["input_ids"])
            e[f"attention_mask{suffix}"] = list(enc["attention_mask"])
        # Human-readable wordpieces (not padded, not truncated, no special tokens).
        e["tokens"] = tokenizer.tokenize(e["text"])

    # Facts the README states.
    line66 = entries[TREC_LINES.index(66)]
    assert "sister\u00f0city" in line66["text"]
    assert line66["tokens"][8:11] == ["sister", "##\u00f0", "##city"], line66["tokens"]
    assert line66["input_ids"][8:11] == [2905, 29668, 12972], line66["input_ids"]
    long = entries[-1]
    assert len(long["tokens"]) == 300 and sum(long["attention_mask"]) == 128
    assert long["input_ids_special"][0] == 101 and long["input_ids_special"][127] == 102

    # One key per line, lists kept on one line: diffable but compact.
    def fmt(entry: dict) -> str:
        fields = [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in entry.items()]
        return "{\n" + ",\n".join(fields) + "\n}"

    with open(FIXTURES / "trec_tokens.json", "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(fmt(e) for e in entries) + "\n]\n")


# --------------------------------------------------------------------------- README

README_TEMPLATE = """\
# tests/fixtures/

Hugging Face parity fixtures: reference outputs of `transformers` {transformers} (the version in the
paper authors' lock file) for the Rust ViT / BERT / preprocessing code. Generated by
`scripts/parity_fixtures.py`; do not edit by hand. All floats are f32 little-endian; integer token
tensors are i64; images are u8.

Regenerate (byte-identical on re-run):

    python3 -m venv /tmp/parity-venv
    /tmp/parity-venv/bin/pip install -r scripts/requirements-parity.txt
    BENIGN_DATA_DIR=/path/to/data BENIGN_MODELS_DIR=/path/to/models \\
        /tmp/parity-venv/bin/python scripts/parity_fixtures.py

Generated with: {versions_line}

| file | bytes | contents |
|---|---|---|
{rows}

## Models (`tiny_vit/`, `tiny_bert/`)

Randomly initialised (`torch.manual_seed(0)`), then EVERY parameter perturbed with `+= 0.1 * N(0, 1)`
(LayerNorm weights/biases, zero-init biases, `cls_token`, position embeddings included), so a weight
that is not loaded, or loaded into the wrong slot, shows up. Saved with
`save_pretrained(safe_serialization=True)`: tensor names have no `vit.` / `bert.` prefix.

- ViT: `ViTModel(config, add_pooling_layer=False)`, image 32, patch 8 (16 patches + CLS = 17 tokens),
  hidden 32, 3 layers, 4 heads, FFN 64, exact-erf `gelu`, `qkv_bias` true,
  **`layer_norm_eps` 1e-6** (not the 1e-12 default: read it from config.json).
- BERT: `BertModel(config, add_pooling_layer=True)`, vocab 64, hidden 32, 3 layers, 4 heads, FFN 64,
  64 positions, 2 token types, exact-erf `gelu`, **`layer_norm_eps` 1e-7**.

Both ran in eval mode, float32, `attn_implementation="eager"`, one CPU thread.
`hidden_states.0` is the embeddings output and `hidden_states.i` the output of layer i, as returned by
`output_hidden_states=True`. For ViT these are before the final `layernorm`; `last_hidden_state` is
after it. For BERT, `hidden_states.3` is the last hidden state (BERT has no final LayerNorm) and
`pooler_output = tanh(dense(hidden_states.3[:, 0]))`. The second BERT row (index 1) has `attention_mask` 0 on
its last 5 positions; HF adds `(1 - mask) * f32::MIN` to the attention scores, and the outputs at the padded
positions are still stored (they are well defined: padded queries attend to the 11 real keys).

## Images (`image_preprocess.safetensors`)

Names: `mnist_0`, `mnist_1` (first two images of MNIST `train-images-idx3-ubyte.gz`), `cifar_0`,
`cifar_1` (first two records of CIFAR-10 `data_batch_1.bin`). Resamples: `bilinear` (PIL 2),
`bicubic` (PIL 3).

- `input.<name>`: u8 as stored; MNIST (28, 28), CIFAR (3, 32, 32) channels-first.
- `resized.<resample>.<name>`: u8 (224, 224, 3) HWC.
- `pixel_values_crop.<resample>.<name>`: f32 (3, 16, 16) = processor output `pixel_values[:, 100:116, 100:116]`.

Pipeline reproduced: MNIST `Image.fromarray(a, "L").convert("RGB")` (grey replicated to 3 channels),
CIFAR `Image.fromarray(chw.transpose(1, 2, 0), "RGB")`, then
`ViTImageProcessor(do_resize=True, size={{"height": 224, "width": 224}}, resample=r, do_rescale=True,
rescale_factor=1/255, do_normalize=True, image_mean=[0.5]*3, image_std=[0.5]*3)`.

What the processor does (transformers {transformers}, `image_transforms.resize`): the PIL image becomes a
u8 HWC numpy array, which is turned back into a PIL image *unchanged* (u8 is not rescaled, no float
conversion before resizing), then `pil_image.resize((224, 224), resample=r, reducing_gap=None)` on the
8-bit RGB image, then `np.array(...)`. So the reference is Pillow's 8-bit resampler (`Resample.c`):
separable, horizontal pass first then vertical, with a u8 intermediate image; per-pixel filter
weights normalised in f64 then rounded to fixed point with `PRECISION_BITS = 22`, accumulated in i32
starting from `1 << 21`, shifted and clamped to 0..=255; bilinear = triangle filter (support 1),
bicubic = Keys cubic with a = -0.5 (support 2); upscaling here, so no support widening.

After resizing: rescale is `(u8 as f64 * (1/255)) as f32`, normalise is
`(x - 0.5f32) / 0.5f32` in f32. The script asserts `resized` equals the processor output both to 1e-6
via `(resized/255 - 0.5)/0.5` and bit-for-bit via that f64→f32 arithmetic, for all 8 image/resample
pairs.

## Text (`trec_tokens.json`)

A JSON list; each object has `source`, `line` (1-based), `text`, `input_ids`, `attention_mask`
(128 each; `add_special_tokens=False`), `input_ids_special`, `attention_mask_special` (128 each;
`add_special_tokens=True`), and `tokens` (the wordpieces of `tokenizer.tokenize(text)`, untruncated,
for reading only). Tokenizer: `BertTokenizerFast.from_pretrained($BENIGN_MODELS_DIR/google-bert/bert-base-uncased)`
called with `padding="max_length", max_length=128, truncation=True` as the authors did. Pad id 0,
`[CLS]` 101, `[SEP]` 102.

Texts: TREC `train_5500.label` lines 1, 2, 3, 4, 66, decoded as Latin-1, text = everything after the
first space (line 66 contains `ð`, byte 0xF0, which tokenizes as `sister ##ð ##city` = 2905, 29668,
12972); AG-news `test.csv` row 1, text = title + " " + description (CSV-unquoted, nothing else
replaced); the same AG-news text repeated 10 times joined by single spaces (300 wordpieces) to
exercise truncation at 128 (with special tokens: `[CLS]` + 126 pieces + `[SEP]`).
"""

DESCRIPTIONS = {
    "tiny_vit/config.json": "ViTConfig of the tiny ViT",
    "tiny_vit/model.safetensors": "its weights (54 tensors, no prefix)",
    "tiny_vit_io.safetensors": "`pixel_values` (2,3,32,32); `hidden_states.0..3` and `last_hidden_state` (2,17,32)",
    "tiny_bert/config.json": "BertConfig of the tiny BERT",
    "tiny_bert/model.safetensors": "its weights (55 tensors incl. `pooler.dense.*`, no prefix)",
    "tiny_bert_io.safetensors": "`input_ids`, `attention_mask`, `token_type_ids` (2,16) i64; `hidden_states.0..3` (2,16,32); `pooler_output` (2,32)",
    "image_preprocess.safetensors": "ViTImageProcessor on 2 MNIST + 2 CIFAR-10 images, bilinear and bicubic",
    "trec_tokens.json": "bert-base-uncased tokenization of 5 TREC questions, 1 AG-news text, 1 overlong text",
}


def write_readme(vers: dict) -> None:
    rows = []
    for rel, desc in DESCRIPTIONS.items():
        size = (FIXTURES / rel).stat().st_size
        rows.append(f"| `{rel}` | {size} | {desc} |")
    versions_line = ", ".join(f"{k} {v}" for k, v in vers.items())
    text = README_TEMPLATE.format(
        transformers=vers["transformers"], versions_line=versions_line, rows="\n".join(rows)
    )
    (FIXTURES / "README.md").write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------- main


def versions() -> dict:
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "pillow": PIL.__version__,
    }


def main() -> None:
    data_dir = env_dir("BENIGN_DATA_DIR")
    models_dir = env_dir("BENIGN_MODELS_DIR")
    if transformers.__version__ != "4.51.3":
        print(f"warning: transformers {transformers.__version__}, the fixtures are meant for 4.51.3",
              file=sys.stderr)
    torch.set_num_threads(1)  # reduction order independent of the machine
    FIXTURES.mkdir(parents=True, exist_ok=True)

    make_tiny_vit()
    make_tiny_bert()
    make_image_preprocess(data_dir)
    make_trec_tokens(data_dir, models_dir)
    write_readme(versions())

    total = 0
    for p in sorted(FIXTURES.rglob("*")):
        if p.is_file():
            total += p.stat().st_size
            print(f"{p.stat().st_size:>10}  {p.relative_to(REPO_ROOT)}")
    print(f"{total:>10}  total")
    print(json.dumps(versions()))
    assert total < 3 * 1024 * 1024, "fixtures exceed 3 MB"


if __name__ == "__main__":
    main()
