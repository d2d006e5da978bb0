#!/usr/bin/env python3
"""The planted-signal bar against what the data hold: with the planted direction and each sample's
class known, is S recoverable within ±20 % at the recovery curve's shapes? Maximum likelihood
over the unknown position (a mixture over the T tokens), Gaussian noise, 100 draws a point.
Needs numpy. docs/design.md, "A planted signal", quotes its output (2026-12-02)."""
import numpy as np
rng = np.random.default_rng(0)
grid = np.linspace(0.0, 8.0, 801)
def mle(z, y):
    # z: (n, T) projections on the known direction, y: (n,) ±1; planted token shifted by y·a.
    ll = []
    for a in grid:
        m = a * y[:, None] * z - a * a / 2
        mx = m.max(axis=1, keepdims=True)
        ll.append((mx[:, 0] + np.log(np.exp(m - mx).mean(axis=1))).sum())
    return grid[int(np.argmax(ll))]
for (T, d, n) in [(197, 192, 200), (197, 192, 1000), (51, 384, 200), (51, 384, 1000), (58, 384, 200)]:
    for S in [0.15, 0.2, 0.3]:
        a = S * np.sqrt(d)
        reads = []
        for rep in range(100):
            y = rng.choice([-1.0, 1.0], n)
            z = rng.standard_normal((n, T))
            z[np.arange(n), rng.integers(0, T, n)] += y * a
            reads.append(mle(z, y))
        reads = np.array(reads) / np.sqrt(d)
        within = np.mean(np.abs(reads / S - 1) <= 0.2)
        print(f"T {T} d {d} n {n} S {S}: oracle-MLE S median {np.median(reads):.3f}, 5-95% [{np.quantile(reads,0.05):.3f}, {np.quantile(reads,0.95):.3f}], within ±20%: {within:.2f}")
