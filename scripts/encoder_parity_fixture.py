"""Runs the authors' one-layer encoder on our parameters and tokens, for tests/one_layer_encoder.rs.

The authors' `OneLayerEncoder` (with `SingleHeadAttention` and `FeedForward`) is executed verbatim:
the three class definitions are taken unchanged from their `main_one_layer.py`, whose path is
given (keitaroskmt/benign-attention at 425cbd4; the rest of that file, which needs hydra, wandb
and their data module, is not run). Our side writes the parameters (torch state_dict names) and
the inputs:

    cargo test --release --test one_layer_encoder -- --ignored write_encoder_parity_inputs

then

    python scripts/encoder_parity_fixture.py --authors-file PATH/main_one_layer.py \\
        --inputs tests/fixtures/encoder_parity_inputs.safetensors \\
        --out tests/fixtures/encoder_parity_torch.safetensors

writes, in float32: the logits and the CLS attention over the data tokens, the loss, every
parameter's gradient of the authors' loss (`grad.<name>`), and the logits and attention after
`steps` full-batch SGD steps of the authors' training loop (`after.logits`, `after.attention`).

Versions the committed fixture was made with: torch 2.6.0 (the authors' uv.lock), einops 0.8.2,
safetensors 0.8.0, Python 3.11 (`pip install torch==2.6.0 einops safetensors numpy`).
"""

import argparse
import ast
from pathlib import Path

import torch
from einops import repeat
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

CLASSES = ("SingleHeadAttention", "FeedForward", "OneLayerEncoder")


def authors_classes(path: Path) -> dict:
    """The authors' class definitions, unchanged, executed with the names they import."""
    tree = ast.parse(path.read_text())
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name in CLASSES]
    if [node.name for node in found] != list(CLASSES):
        raise SystemExit(f"{path}: expected classes {CLASSES}, found {[n.name for n in found]}")
    namespace = {"torch": torch, "nn": nn, "Tensor": Tensor, "repeat": repeat}
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--authors-file", type=Path, required=True)
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    torch.set_num_threads(1)
    inputs = load_file(str(args.inputs))
    data, target = inputs.pop("data"), inputs.pop("target")
    learning_rate = float(inputs.pop("learning_rate").item())
    steps = int(inputs.pop("steps").item())
    dim = data.shape[-1]
    mlp_dim = inputs["ff.net.1.weight"].shape[0]

    classes = authors_classes(args.authors_file)
    model = classes["OneLayerEncoder"](dim=dim, mlp_dim=mlp_dim, use_skip_connection=True)
    model.load_state_dict(inputs, strict=True)

    out = {}
    output, attention_scores = model.forward_with_scores(data)
    loss = torch.log(1.0 + torch.exp(-target * output)).mean()
    loss.backward()
    out["logits"] = output.detach()
    out["attention"] = attention_scores.detach()
    out["loss"] = loss.detach().reshape(1)
    for name, parameter in model.named_parameters():
        out[f"grad.{name}"] = parameter.grad.detach().clone()

    # The authors' loop: zero_grad, forward, loss, backward, step.
    model.zero_grad()
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    for _ in range(steps):
        optimizer.zero_grad()
        output, _ = model.forward_with_scores(data)
        torch.log(1.0 + torch.exp(-target * output)).mean().backward()
        optimizer.step()
    with torch.no_grad():
        output, attention_scores = model.forward_with_scores(data)
    out["after.logits"] = output
    out["after.attention"] = attention_scores
    save_file({k: v.contiguous() for k, v in out.items()}, str(args.out))


if __name__ == "__main__":
    main()
