#!/usr/bin/env python3
"""Writes tests/fixtures/own/: small datasets in the layouts `folder:`, `csv:`, `jsonl:` and `hf:`
read (docs/data.md, "Your own data"), each made by the tool a user would make it with (Pillow for
the images, Python's csv and json modules for the tables, the `datasets` library's
`Dataset.to_parquet` for the hub's Parquet layout), and the numpy draw the authors' split makes
over the folder pool's documented order (tests/own_data.rs).

    python3 scripts/make_own_fixtures.py   # needs numpy, Pillow and datasets
"""
import csv
import json
import os
import shutil

import numpy as np
from PIL import Image

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "own")


def images_split(root):
    """train/ and test/ with two classes of 16x16 RGB images, PNG and JPEG mixed."""
    rng = np.random.default_rng(0)
    for part, count in (("train", 12), ("test", 4)):
        for k, name in enumerate(("cat", "dog")):
            folder = os.path.join(root, part, name)
            os.makedirs(folder)
            for i in range(count):
                base = np.full((16, 16, 3), 60 + 120 * k, dtype=np.int16)
                pixels = np.clip(base + rng.integers(-40, 40, (16, 16, 3)), 0, 255).astype(np.uint8)
                ext = "png" if i % 2 == 0 else "jpg"
                Image.fromarray(pixels, "RGB").save(os.path.join(folder, f"{name}_{i:02d}.{ext}"))


def images_pool(root):
    """One pool: classes named 2, 10 and 7 (integers: numeric order 2, 7, 10), grayscale PNGs of
    two sizes, every image one constant grey value unique to the file, listed in the documented
    order so the test can check the order and the authors' draw over it."""
    values = iter(range(1, 256))
    documented = []  # (class, file, value) in the documented order
    for name in ("2", "7", "10"):
        folder = os.path.join(root, name)
        os.makedirs(folder)
        files = []
        for i in range(15):
            value = next(values)
            size = (12, 12) if i % 3 else (20, 16)
            file = f"img{i:02d}.png"
            Image.fromarray(np.full(size, value, dtype=np.uint8), "L").save(os.path.join(folder, file))
            files.append((name, file, value))
        documented.extend(sorted(files, key=lambda f: f[1].encode()))
    # Every fifth of each class is the test split; the rest, in order, is the training split.
    train = [f for f in documented if (int(f[1][3:5]) + 1) % 5 != 0]
    seed, pretrain_n, n = 7, 20, 10
    choice = np.random.default_rng(seed).choice(len(train), pretrain_n + n, replace=False)
    expected = {
        "source": "scripts/make_own_fixtures.py",
        "train_values": [v for _, _, v in train],
        "seed": seed,
        "pretrain_n": pretrain_n,
        "n": n,
        "choice": [int(c) for c in choice],
    }
    with open(os.path.join(OUT, "images_pool.expected.json"), "w") as f:
        json.dump(expected, f, indent=1)


WORDS = {
    1: "awful broken refund waste poor".split(),
    2: "fine average okay decent plain".split(),
    3: "great superb love excellent perfect".split(),
}


def sentence(rng, label):
    words = list(rng.choice(WORDS[label], 4)) + list(rng.choice(["the", "a", "it", "was", "item"], 3))
    rng.shuffle(words)
    return " ".join(words)


def reviews_csv(path):
    """One pool: columns id, review, stars (integers 1-3); quoting as Python's csv writes it."""
    rng = np.random.default_rng(1)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "review", "stars"])
        for i in range(60):
            stars = i % 3 + 1
            text = sentence(rng, stars)
            if i % 7 == 0:
                text += ', "quoted", and a comma'
            writer.writerow([i, text, stars])


def topics_jsonl(root):
    """train.jsonl and test.jsonl: {"text", "label"} with word labels."""
    rng = np.random.default_rng(2)
    os.makedirs(root)
    topics = {"sport": "goal match team score win", "tech": "chip code cloud phone data"}
    for part, count in (("train", 40), ("test", 12)):
        with open(os.path.join(root, f"{part}.jsonl"), "w") as f:
            for i in range(count):
                label = ("sport", "tech")[i % 2]
                words = list(rng.choice(topics[label].split(), 5)) + ["the", "news"]
                rng.shuffle(words)
                f.write(json.dumps({"text": " ".join(words), "label": label, "id": i}) + "\n")


def hf_images(root):
    """The hub's Parquet layout (<config>/<split>/0000.parquet) of a dataset with an Image and a
    ClassLabel feature, written by `datasets` itself: 16x16 RGB images, PNG-encoded by the Image
    feature, classes ant and bee."""
    import datasets

    rng = np.random.default_rng(3)
    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=["ant", "bee"])}
    )
    for split, count in (("train", 12), ("test", 4)):
        images, labels = [], []
        for i in range(count):
            label = i % 2
            base = np.full((16, 16, 3), 50 + 150 * label, dtype=np.int16)
            pixels = np.clip(base + rng.integers(-30, 30, (16, 16, 3)), 0, 255).astype(np.uint8)
            images.append(Image.fromarray(pixels, "RGB"))
            labels.append(label)
        folder = os.path.join(root, "default", split)
        os.makedirs(folder)
        dataset = datasets.Dataset.from_dict({"img": images, "label": labels}, features=features)
        dataset.to_parquet(os.path.join(folder, "0000.parquet"))


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    images_split(os.path.join(OUT, "images_split"))
    images_pool(os.path.join(OUT, "images_pool"))
    reviews_csv(os.path.join(OUT, "reviews.csv"))
    topics_jsonl(os.path.join(OUT, "topics"))
    hf_images(os.path.join(OUT, "hf_images"))


if __name__ == "__main__":
    main()
