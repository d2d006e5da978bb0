#!/usr/bin/env python3
"""A copy of one dataset folder of a data root with its training labels permuted: the same
inputs, labels that carry no signal. The null on which a signal measure must read zero
(`diagnose snr` on the copy: docs/design.md, "The SNR of real tokens").

    scripts/shuffle-labels.py DATA_ROOT OUT_ROOT DATASET [--seed 0]

DATASET is one of breastmnist, pneumoniamnist, mnist, cifar10, trec, ag_news. OUT_ROOT/<folder>
gets every file of DATA_ROOT/<folder>, the training labels permuted with numpy's
default_rng(seed) (AG-news has only its test file here: its class column is permuted, since the
crate carves its training pool from it). Then:

    BENIGN_DATA_DIR=OUT_ROOT benign-attention diagnose snr --dataset DATASET --n 200 --eta 0

Needs numpy.
"""

import argparse
import csv
import gzip
import io
import shutil
from pathlib import Path

import numpy as np

FOLDERS = {
    "breastmnist": "medmnist",
    "pneumoniamnist": "medmnist",
    "mnist": "mnist",
    "cifar10": "cifar10",
    "trec": "trec",
    "ag_news": "ag_news",
}


def medmnist(src: Path, dst: Path, name: str, rng) -> None:
    arrays = dict(np.load(src / f"{name}.npz"))
    arrays["train_labels"] = rng.permutation(arrays["train_labels"])
    np.savez_compressed(dst / f"{name}.npz", **arrays)


def mnist(src: Path, dst: Path, rng) -> None:
    raw = gzip.open(src / "train-labels-idx1-ubyte.gz").read()
    labels = rng.permutation(np.frombuffer(raw[8:], dtype=np.uint8))
    with gzip.open(dst / "train-labels-idx1-ubyte.gz", "wb") as out:
        out.write(raw[:8] + labels.tobytes())


def cifar10(src: Path, dst: Path, rng) -> None:
    record = 1 + 3 * 32 * 32
    batches = [f"cifar-10-batches-bin/data_batch_{k}.bin" for k in range(1, 6)]
    data = [bytearray((src / b).read_bytes()) for b in batches]
    labels = np.concatenate([np.frombuffer(bytes(d[::record]), dtype=np.uint8) for d in data])
    labels = rng.permutation(labels)
    start = 0
    for batch, d in zip(batches, data):
        count = len(d) // record
        d[::record] = labels[start : start + count].tobytes()
        start += count
        (dst / batch).write_bytes(bytes(d))


def trec(src: Path, dst: Path, rng) -> None:
    # Latin-1, one "COARSE:fine words" line per question: the label is the first word.
    lines = (src / "train_5500.label").read_bytes().split(b"\n")
    rows = [line.split(b" ", 1) for line in lines if line]
    labels = rng.permutation(np.array([r[0] for r in rows], dtype=object))
    text = b"\n".join(label + b" " + r[1] for label, r in zip(labels, rows)) + b"\n"
    (dst / "train_5500.label").write_bytes(text)


def ag_news(src: Path, dst: Path, rng) -> None:
    with open(src / "test.csv", newline="") as text:
        rows = list(csv.reader(text))
    classes = rng.permutation(np.array([r[0] for r in rows]))
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    for cls, row in zip(classes, rows):
        writer.writerow([cls] + row[1:])
    with open(dst / "test.csv", "w", newline="") as text:
        text.write(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data_root", type=Path)
    parser.add_argument("out_root", type=Path)
    parser.add_argument("dataset", choices=sorted(FOLDERS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    folder = FOLDERS[args.dataset]
    src, dst = args.data_root / folder, args.out_root / folder
    if not src.is_dir():
        parser.error(f"{src}: no such folder")
    if dst.exists():
        parser.error(f"{dst}: exists; choose another OUT_ROOT")
    shutil.copytree(src, dst)
    rng = np.random.default_rng(args.seed)
    if folder == "medmnist":
        medmnist(src, dst, args.dataset, rng)
    else:
        globals()[args.dataset](src, dst, rng)
    print(f"{dst}: {args.dataset} with its training labels permuted (seed {args.seed})")


if __name__ == "__main__":
    main()
