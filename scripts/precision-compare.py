#!/usr/bin/env python3
"""Table 2 in two precisions, side by side: the same grid made with `--precision f32` and
`--precision bf16` (the same seeds, splits and flipped labels; only the backbone's features
differ), read from each grid's results.csv and verdicts.csv.

For every dataset, mode and eta it prints the verdict of each precision, the seeds' mean test
accuracy, memorization and train loss, and the paired differences (bf16 minus f32, seed by
seed) of the test accuracy and memorization against the seeds' own spread (the sample standard
deviation of the f32 seeds): a difference inside that spread is one the seeds already make.

Usage:
  python3 scripts/precision-compare.py --f32 results/table2-f32 --bf16 results/table2-bf16 \\
      --out results/table2-precision/compare.md

Each of --f32 and --bf16 holds one folder per grid (e.g. breastmnist-last-layer/) with the
results.csv and verdicts.csv that `reproduce table2` writes. Standard library only.
"""

import argparse
import csv
import statistics
import sys
from pathlib import Path


def rows(grid: Path) -> dict:
    """(dataset, mode, n, eta, seed) -> the run's row of results.csv."""
    path = grid / "results.csv"
    if not path.is_file():
        sys.exit(f"error: {path}: no results.csv (is the grid finished?)")
    out = {}
    with path.open() as f:
        for r in csv.DictReader(f):
            key = (r["config.dataset"], r["config.mode"], int(r["config.n"]), float(r["config.eta"]), int(r["config.seed"]))
            out[key] = r
    return out


def verdicts(grid: Path) -> dict:
    path = grid / "verdicts.csv"
    if not path.is_file():
        sys.exit(f"error: {path}: no verdicts.csv")
    with path.open() as f:
        return {(r["dataset"], r["mode"], int(r["n"])): r for r in csv.DictReader(f)}


def read(root: Path) -> tuple[dict, dict]:
    runs, cells = {}, {}
    grids = sorted(p for p in root.iterdir() if (p / "results.csv").is_file())
    if not grids:
        sys.exit(f"error: {root}: no grid folders holding results.csv")
    for grid in grids:
        runs.update(rows(grid))
        cells.update(verdicts(grid))
    return runs, cells


def sd(values: list) -> float:
    return statistics.stdev(values) if len(values) > 1 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--f32", type=Path, required=True)
    parser.add_argument("--bf16", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    f32_runs, f32_cells = read(args.f32)
    bf16_runs, bf16_cells = read(args.bf16)
    for key, r in bf16_runs.items():
        if r.get("config.precision") != "bf16":
            sys.exit(f"error: {args.bf16}: run {r['run']} has precision {r.get('config.precision')!r}, not bf16")
    for key, r in f32_runs.items():
        if r.get("config.precision", "") not in ("", "f32", "NaN"):
            sys.exit(f"error: {args.f32}: run {r['run']} has precision {r['config.precision']!r}, not f32")

    lines = [
        "# Table 2 in f32 and bf16",
        "",
        f"`--f32 {args.f32}` against `--bf16 {args.bf16}`: the same runs (seeds, splits, flipped labels);",
        "only the backbone's products differ. Δ: bf16 minus f32, seed by seed (percentage points);",
        "spread: the sample standard deviation of the f32 seeds. Made by scripts/precision-compare.py.",
        "",
        "## Verdicts",
        "",
        "| dataset | mode | n | f32 | bf16 | same |",
        "|---|---|---|---|---|---|",
    ]
    same_verdicts = 0
    for cell in sorted(set(f32_cells) & set(bf16_cells)):
        a, b = f32_cells[cell]["verdict"], bf16_cells[cell]["verdict"]
        same_verdicts += a == b
        lines.append(f"| {cell[0]} | {cell[1]} | {cell[2]} | {a} | {b} | {'yes' if a == b else '**no**'} |")
    cells = sorted(set(f32_cells) & set(bf16_cells))
    lines += [
        "",
        f"{same_verdicts} of {len(cells)} cells give the same verdict.",
        "",
        "## Runs",
        "",
        "| dataset | mode | n | η | seeds | test acc f32 | test acc bf16 | Δ test (pp), per seed | f32 spread (pp) | memorization f32 | bf16 | Δ mem (pp), per seed | train loss f32 | bf16 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    inside = total = 0
    groups = sorted({k[:4] for k in f32_runs} & {k[:4] for k in bf16_runs})
    for group in groups:
        seeds = sorted(k[4] for k in f32_runs if k[:4] == group and (group + (k[4],)) in bf16_runs)
        pair = [(f32_runs[group + (s,)], bf16_runs[group + (s,)]) for s in seeds]
        num = lambda r, c: float(r[c])
        acc_f = [num(a, "final.test_acc") for a, _ in pair]
        acc_b = [num(b, "final.test_acc") for _, b in pair]
        mem_f = [num(a, "final.memorization") for a, _ in pair]
        mem_b = [num(b, "final.memorization") for _, b in pair]
        loss_f = [num(a, "final.train_loss") for a, _ in pair]
        loss_b = [num(b, "final.train_loss") for _, b in pair]
        spread = 100 * sd(acc_f)
        d_acc = [100 * (b - a) for a, b in zip(acc_f, acc_b)]
        d_mem = [100 * (b - a) for a, b in zip(mem_f, mem_b)]
        for d in d_acc:
            total += 1
            inside += abs(d) <= spread
        mean = statistics.fmean
        mem = lambda v: "—" if any(x != x for x in v) else f"{mean(v):.3f}"
        dmem = "—" if any(x != x for x in d_mem) else ", ".join(f"{d:+.1f}" for d in d_mem)
        lines.append(
            f"| {group[0]} | {group[1]} | {group[2]} | {group[3]:g} | {','.join(map(str, seeds))} | "
            f"{mean(acc_f):.4f} | {mean(acc_b):.4f} | {', '.join(f'{d:+.2f}' for d in d_acc)} | {spread:.2f} | "
            f"{mem(mem_f)} | {mem(mem_b)} | {dmem} | {mean(loss_f):.4f} | {mean(loss_b):.4f} |"
        )
    lines += [
        "",
        f"{inside} of {total} per-seed test-accuracy differences lie within their cell's f32 spread.",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(args.out)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
