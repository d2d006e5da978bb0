"""Reference eigen-statistics for tests/fixtures/spectrum.json (numpy, computed once).

For each matrix W: eigenvalues λ (complex in general) and
  mean_real = mean(Re λ), var_real = population variance of Re λ,
  mean_abs  = mean(|λ|),  var_abs  = population variance of |λ|,
  sym_mean, sym_var = the same over the (real) eigenvalues of (W + Wᵀ)/2.
Run: python scripts/diagnostics_fixture.py > tests/fixtures/spectrum.json
"""
import json

import numpy as np


def stats(w):
    lam = np.linalg.eigvals(w)
    sym = np.linalg.eigvalsh((w + w.T) / 2)
    return {
        "mean_real": float(np.mean(lam.real)),
        "var_real": float(np.var(lam.real)),
        "mean_abs": float(np.mean(np.abs(lam))),
        "var_abs": float(np.var(np.abs(lam))),
        "sym_mean": float(np.mean(sym)),
        "sym_var": float(np.var(sym)),
    }


rng = np.random.default_rng(20240214)
theta = 0.7
a = rng.standard_normal((6, 6))
cases = {
    "diagonal": np.diag([1.0, 2.0, 3.0, -4.0]),
    "rotation": np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]]),
    "random_symmetric": (a + a.T) / 2,
    "random": rng.standard_normal((7, 7)),
}
print(json.dumps({name: {"matrix": m.tolist(), **stats(m)} for name, m in cases.items()}, indent=1))
