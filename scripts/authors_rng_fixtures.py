#!/usr/bin/env python3
"""Write tests/fixtures/authors_rng.json from REAL numpy and torch (CPU).

The Rust replicas of the authors' random streams, src/rng/numpy.rs and src/rng/torch.rs, are checked
against this file by tests/authors_rng.rs; its `real_splits` cases (the authors' split and label noise
on the real clean labels of TREC and BreastMNIST) are checked by tests/authors_split.rs through
`benign-attention data split --rng authors`.

Environment: numpy 2.2.3 and torch 2.6.0, the versions of the authors' uv.lock. The PyPI torch wheel
does not import without its nvidia-* dependencies (`pip install --no-deps` fails with libcublas not
found), so install it whole (about 3 GB; only its CPU generator is used):

    python3 -m venv /tmp/authors-rng-venv
    /tmp/authors-rng-venv/bin/pip install numpy==2.2.3 torch==2.6.0

Then, from the repository root, with the data folder holding the release files (only
trec/train_5500.label and medmnist/breastmnist.npz are read):

    /tmp/authors-rng-venv/bin/python scripts/authors_rng_fixtures.py --data-dir /path/to/data

(--data-dir defaults to $BENIGN_DATA_DIR.) The output is the same on every run.
Everything here calls the libraries exactly as the authors' code does (docs/protocol.md, "The authors'
random streams"); the label noise evaluates their `add_label_noise` line verbatim, `dtype=torch.float`
(float32: one u32 for the flip, one for the offset, two per row).

One case at settings of your choosing, to compare with `benign-attention data split --rng authors`
(scripts/authors_split_check.sh does both and compares them):

    python scripts/authors_rng_fixtures.py --data-dir DATA --case trec,3000,137,0.15,2026
"""
import argparse
import gzip
import hashlib
import json
import os
import platform
import struct
import sys

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "authors_rng.json")

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--data-dir", default=os.environ.get("BENIGN_DATA_DIR"),
                    help="folder holding trec/ and medmnist/ (default: $BENIGN_DATA_DIR)")
parser.add_argument("--case", metavar="DATASET,P,N,ETA,SEED",
                    help="print the authors' split and noisy labels of one case as JSON instead of writing the fixture")
ARGS = parser.parse_args()
if not ARGS.data_dir:
    sys.exit("the real_splits cases read real labels: pass --data-dir or set BENIGN_DATA_DIR")


def digest(arr):
    """sha256 of the comma-joined decimal values, e.g. "3,0,2"."""
    return hashlib.sha256(",".join(str(int(v)) for v in arr).encode()).hexdigest()


def summary(arr, full):
    arr = [int(v) for v in arr]
    d = {"len": len(arr), "first20": arr[:20], "last20": arr[-20:], "sha256": digest(arr)}
    if full:
        d["full"] = arr
    return d


def f64_bits(x):
    return "0x%016x" % struct.unpack("<Q", struct.pack("<d", float(x)))[0]


# ---------------------------------------------------------------- torch: label noise
def add_label_noise(labels, noise_ratio, num_classes):
    """The tensor branch of the authors' src/datasets/utils.py `add_label_noise`, line for line."""
    if noise_ratio <= 0:
        return labels
    mask = torch.rand_like(labels, dtype=torch.float) < noise_ratio
    noise_labels = (labels + torch.randint_like(labels, low=1, high=num_classes)) % num_classes
    return torch.where(mask, noise_labels, labels)


def authors_label_noise(clean, C, eta, seed):
    """torch.manual_seed(seed), then add_label_noise once per fine-tune row in order, each on a 0-d int64
    tensor, as their `datasets.map` over the fine-tune rows calls it."""
    torch.manual_seed(seed)
    return [int(add_label_noise(torch.tensor(y, dtype=torch.int64), eta, C)) for y in clean]


# ---------------------------------------------------------------- real labels, in release (= HF row) order
# TREC coarse ids in the order of the Hugging Face `trec` dataset (its _COARSE_LABELS), which the authors used.
TREC_COARSE = ["ABBR", "ENTY", "DESC", "HUM", "LOC", "NUM"]


def file_sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def trec_train_labels(data_dir):
    """Coarse label ids of trec/train_5500.label, one per non-empty line, in file order."""
    path = os.path.join(data_dir, "trec", "train_5500.label")
    with open(path, "rb") as f:
        lines = [line for line in f.read().decode("latin-1").splitlines() if line.strip()]
    return path, [TREC_COARSE.index(line.split(" ", 1)[0].split(":")[0]) for line in lines]


def breastmnist_train_labels(data_dir):
    path = os.path.join(data_dir, "medmnist", "breastmnist.npz")
    with np.load(path) as archive:
        return path, [int(v) for v in archive["train_labels"].reshape(-1)]


def mnist_train_labels(data_dir):
    """train-labels-idx1-ubyte.gz: IDX magic 2049, count, then one byte per label."""
    path = os.path.join(data_dir, "mnist", "train-labels-idx1-ubyte.gz")
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, count = struct.unpack(">II", raw[:8])
    assert magic == 2049 and count == len(raw) - 8, path
    return path, list(raw[8:])


LABEL_READERS = {"trec": trec_train_labels, "breastmnist": breastmnist_train_labels, "mnist": mnist_train_labels}


def real_case(name, C, P, n, eta, seed):
    """The authors' split (choice over the N training rows, pretrain = first P, fine-tune = next n) and their
    label noise on the fine-tune rows' real clean labels."""
    path, labels = LABEL_READERS[name](ARGS.data_dir)
    r = [int(v) for v in np.random.default_rng(seed).choice(len(labels), P + n, replace=False)]
    clean = [labels[i] for i in r[P:]]
    noisy = authors_label_noise(clean, C, eta, seed)
    return {
        "dataset": name, "N": len(labels), "classes": C, "P": P, "n": n, "eta": eta, "seed": seed,
        "labels_file": os.path.relpath(path, ARGS.data_dir), "labels_file_sha256": file_sha256(path),
        "pretrain_indices": r[:P], "finetune_indices": r[P:],
        "finetune_clean_labels": clean, "finetune_labels": noisy,
        "noisy_mask": [a != b for a, b in zip(clean, noisy)],
    }


if ARGS.case:
    name, P, n, eta, seed = ARGS.case.split(",")
    classes = {"trec": 6, "breastmnist": 2, "mnist": 10}[name]
    case = real_case(name, classes, int(P), int(n), float(eta), int(seed))
    json.dump({"versions": {"numpy": np.__version__, "torch": torch.__version__}, **case}, sys.stdout)
    sys.stdout.write("\n")
    sys.exit(0)


# ---------------------------------------------------------------- numpy: the data split
# (dataset, N = size of the HF train split, P = pretrain size, fine-tune sizes n)
DATASETS = [
    ("MNIST", 60000, 10000, [20, 200, 1000]),
    ("CIFAR-10", 50000, 10000, [20, 200, 1000]),
    ("PneumoniaMNIST", 4708, 3000, [20, 200, 1000]),
    ("BreastMNIST", 546, 200, [20, 200]),
    ("AG-news", 120000, 10000, [20, 200, 1000]),
    ("TREC", 5452, 3000, [20, 200, 1000]),
]
CHOICE_SEEDS = [42, 314, 2718, 7, 123456]
FULL_DATASETS = {"TREC", "BreastMNIST", "PneumoniaMNIST"}
FULL_SEEDS = {7, 123456}


def choice_path(N, k):
    # Generator.choice (replace=False, p=None): tail shuffle iff pop_size > 10000 and size > pop_size // 50.
    return "tail_shuffle" if (N > 10000 and k > N // 50) else "floyd"


choice_cases = []
for name, N, P, ns in DATASETS:
    for n in ns:
        k = P + n
        for seed in CHOICE_SEEDS:
            r = np.random.default_rng(seed).choice(N, k, replace=False)
            full = name == "BreastMNIST" or (name in FULL_DATASETS and seed in FULL_SEEDS)
            case = {"dataset": name, "N": N, "k": k, "P": P, "n": n, "seed": seed, "path": choice_path(N, k)}
            case.update(summary(r, full))
            choice_cases.append(case)

# Extra cases around the path switch for N > 10000: k = N // 50 is Floyd, k = N // 50 + 1 is the tail shuffle;
# plus k = N (whole permutation, tail shuffle down to index 1) and a tiny population.
for N, k in [(60000, 1200), (60000, 1201), (20000, 20000), (10001, 201), (3, 3)]:
    for seed in [42, 0]:
        r = np.random.default_rng(seed).choice(N, k, replace=False)
        case = {"dataset": "extra", "N": N, "k": k, "P": 0, "n": k, "seed": seed, "path": choice_path(N, k)}
        case.update(summary(r, k <= 3))
        choice_cases.append(case)

# SeedSequence / PCG64 raw words for a few seeds.
pcg_cases = []
for seed in [42, 0, 7, 314, 2718, 123456, 2**32 - 1]:
    ss = np.random.SeedSequence(seed)
    pcg_cases.append({
        "seed": seed,
        "pool": [int(v) for v in ss.pool],
        "state_u64": ["0x%016x" % int(v) for v in ss.generate_state(4, np.uint64)],
        "random_raw": ["0x%016x" % int(v) for v in np.random.default_rng(seed).bit_generator.random_raw(6)],
    })

# ---------------------------------------------------------------- torch: label noise on synthetic clean labels
noise_cases = []
for S in [20, 200, 1000]:
    for eta in [0.1, 0.2]:
        for C in [2, 4, 6, 10]:
            for seed in [42, 314, 7]:
                clean = [j % C for j in range(S)]
                noisy = authors_label_noise(clean, C, eta, seed)
                # C <= 10, so every label is one decimal digit: store the full vector as a digit string.
                noise_cases.append({"S": S, "eta": eta, "C": C, "seed": seed, "clean": "j % C",
                                    "noisy": "".join(str(v) for v in noisy)})

# The protocol's test vector (docs/protocol.md): S = 200, eta = 0.1, C = 10, seed 42, with all-zero clean labels (a flipped row's label is
# its offset).
paper_noise = authors_label_noise([0] * 200, 10, 0.1, 42)

# ---------------------------------------------------------------- torch: randperm
randperm_cases = []
for n in [20, 200, 1000, 3000, 10000]:
    for seed in [42, 43, 316, 2760]:
        p = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
        case = {"n": n, "seed": seed}
        case.update(summary(p, n <= 1000))
        randperm_cases.append(case)

# ---------------------------------------------------------------- torch: raw MT19937 and rand conversions
mt_cases = []
for seed in [42, 0, 7, 2**32 + 42]:
    torch.manual_seed(seed)
    # randint(0, 2^32 - 1) is random() % (2^32 - 1): the raw u32 except that 2^32 - 1 would read 0.
    # 700 > 624 words crosses a twist (seed 42 only, to keep the file small).
    u32 = torch.randint(0, 2**32 - 1, (700 if seed == 42 else 20,), dtype=torch.int64).tolist()
    torch.manual_seed(seed)
    f32 = torch.rand(8).tolist()  # float32 -> exact in a Python float
    torch.manual_seed(seed)
    f64 = torch.rand(8, dtype=torch.float64).tolist()
    mt_cases.append({
        "seed": seed,
        "u32_mod_2p32m1": u32,
        "rand_f32_bits": [f64_bits(v) for v in f32],
        "rand_f64_bits": [f64_bits(v) for v in f64],
        "rand_f32": f32,
        "rand_f64": f64,
    })

# ---------------------------------------------------------------- the authors' split + noise on real labels
# (dataset id of the CLI, classes, P, n, eta, seed): seeds other than 42, eta = 0.2.
REAL_SPLITS = [
    ("trec", 6, 3000, 200, 0.2, 7),
    ("breastmnist", 2, 200, 200, 0.2, 7),
    ("mnist", 10, 10000, 200, 0.2, 7),
]
real_cases = [real_case(*case) for case in REAL_SPLITS]

fixture = {
    "generated_by": "scripts/authors_rng_fixtures.py",
    "versions": {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__},
    "notes": {
        "choice": "np.random.default_rng(seed).choice(N, k, replace=False); sha256 over ','.join(indices)",
        "label_noise": "noisy = one decimal digit per row; clean[j] = j % C; torch.manual_seed(seed); per row, on a 0-d int64 tensor: "
                       "the authors' add_label_noise (rand_like(labels, dtype=torch.float) < noise_ratio, (labels + randint_like(labels, 1, C)) % C)",
        "randperm": "torch.randperm(n, generator=torch.Generator().manual_seed(seed))",
        "mt19937": "floats stored as IEEE-754 double bit patterns (float32 values widened exactly)",
        "real_splits": "the authors' split (choice over the N training rows, pretrain = first P, fine-tune = next n, "
                       "release indices in draw order) and label noise on the real clean labels of the fine-tune rows",
    },
    "pcg64": pcg_cases,
    "choice": choice_cases,
    "label_noise": noise_cases,
    "paper_noise_s200_eta01_c10_seed42_zero_clean": paper_noise,
    "randperm": randperm_cases,
    "mt19937": mt_cases,
    "real_splits": real_cases,
}

os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "w") as f:
    json.dump(fixture, f, separators=(",", ":"))
    f.write("\n")
print("wrote %s (%d bytes) with numpy %s, torch %s" % (os.path.normpath(OUT), os.path.getsize(OUT),
                                                      np.__version__, torch.__version__), file=sys.stderr)
