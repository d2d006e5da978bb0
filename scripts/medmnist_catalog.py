#!/usr/bin/env python3
"""Writes datasets/medmnist.toml, the MedMNIST 2D family as the official release describes it,
from the `medmnist` package's INFO table (read as text: nothing of the package runs, and the
toolkit does not need Python at run time).

    pip download medmnist==3.0.2 --no-deps -d /tmp/m && unzip -o -q /tmp/m/*.whl -d /tmp/m
    python3 scripts/medmnist_catalog.py /tmp/m/medmnist/info.py > datasets/medmnist.toml
"""
import ast
import sys


def info(path):
    tree = ast.parse(open(path).read())
    version = INFO = None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            name = getattr(node.targets[0], "id", None)
            if name == "INFO":
                INFO = ast.literal_eval(node.value)
            elif name == "__version__":
                version = ast.literal_eval(node.value)
    return version, INFO


def quote(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def main():
    version, table = info(sys.argv[1])
    print(f"# The MedMNIST 2D family (MedMNIST v2, Yang et al. 2023; MedMNIST+ sizes 64, 128, 224),")
    print(f"# from the `medmnist` package {version}'s INFO by scripts/medmnist_catalog.py: do not edit.")
    print("# The 3D tasks are left out (volumes, not images).")
    for task, entry in table.items():
        if task.endswith("3d"):
            continue
        labels = entry["label"]
        print()
        print("[[task]]")
        print(f"name = {quote(task)}")
        print(f"title = {quote(entry['python_class'])}")
        print(f"task = {quote(entry['task'])}")
        print(f"channels = {entry['n_channels']}")
        print("classes = [" + ", ".join(quote(labels[str(k)]) for k in range(len(labels))) + "]")
        samples = entry["n_samples"]
        print(f"samples = {{ train = {samples['train']}, val = {samples['val']}, test = {samples['test']} }}")
        for size, suffix in [(28, ""), (64, "_64"), (128, "_128"), (224, "_224")]:
            print()
            print("[[task.size]]")
            print(f"pixels = {size}")
            print(f"url = {quote(entry['url' + suffix])}")
            print(f"md5 = {quote(entry['MD5' + suffix])}")


main()
