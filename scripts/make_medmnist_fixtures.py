#!/usr/bin/env python3
"""Writes tests/fixtures/medmnist/: one small npz per MedMNIST 2D task in the official key layout,
dtypes and shapes ({train,val,test}_images uint8 (N, H, W) or (N, H, W, 3), {split}_labels uint8
(N, 1), ChestMNIST's (N, 14)), as numpy writes the release (np.savez_compressed), with seeded random
pixels and labels cycling through the classes; and organamnist_64.npz at MedMNIST+'s 64 px.
Classes and channels come from datasets/medmnist.toml.

    python3 scripts/make_medmnist_fixtures.py   (numpy; run from the repository root)
"""
import os
import tomllib

import numpy as np

SPLITS = {"train": 16, "val": 4, "test": 8}


def write(task, pixels, out):
    rng = np.random.default_rng(len(task["name"]) * 1000 + pixels)
    classes = len(task["classes"])
    arrays = {}
    for split, count in SPLITS.items():
        shape = (count, pixels, pixels) + ((3,) if task["channels"] == 3 else ())
        # Eight grey levels: small files that still differ image to image.
        arrays[f"{split}_images"] = (rng.integers(0, 8, size=shape) * 32).astype(np.uint8)
        if task["task"].startswith("multi-label"):
            labels = rng.integers(0, 2, size=(count, classes), dtype=np.uint8)
        else:
            labels = (np.arange(count) % classes).astype(np.uint8).reshape(count, 1)
        arrays[f"{split}_labels"] = labels
    suffix = "" if pixels == 28 else f"_{pixels}"
    np.savez_compressed(os.path.join(out, f"{task['name']}{suffix}.npz"), **arrays)


def main():
    with open("datasets/medmnist.toml", "rb") as f:
        family = tomllib.load(f)
    out = "tests/fixtures/medmnist"
    os.makedirs(out, exist_ok=True)
    for task in family["task"]:
        write(task, 28, out)
        if task["name"] == "organamnist":
            write(task, 64, out)


main()
