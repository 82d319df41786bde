"""The SmolLM2 record of the top-N interventions: dNLL against N, N*_tau, and geometry against function.

Run from the repository root (the 4 x 128 record took about 15 minutes per
part on a loaded 2-core CPU):

    python scripts/intervention_record.py OUT [WINDOWS] [CONTEXT] [model|layer]

On WINDOWS windows of CONTEXT tokens of the bundled text, N = 1, 2, 4, ..., 64,
200 bootstrap replicates, attention ranking:

- ``model``: every layer and head intervened at once, both modes, 16 random
  controls: relative dNLL with its interval and the controls' mean and
  interval; N*_tau of the model (renormalise).
- ``layer``: one layer at a time, both modes, no controls: relative dNLL by
  layer; N*_tau by layer; Spearman across layers of F_N, P and R against dNLL
  (`tl_geometry.interventions.geometry_vs_dnll`), with intervals.

Writes OUT/record_<part>.json (and the sweeps and the geometry result) and
prints the JSON.
"""

import json
import sys
import time
from pathlib import Path

import torch

from tl_geometry.analysis.sweep_statistics import geometry_vs_dnll
from tl_geometry.corpus_input.plain_text import default_text
from tl_geometry.corpus_input.token_windows import window_documents
from tl_geometry.interventions.sweep import effective_set_size, intervention_sweep
from tl_geometry.models import load_model
from tl_geometry.runs.corpus_run import analyze_corpus

GRID = [1, 2, 4, 8, 16, 32, 64]
BOOTSTRAP = 200


def model_part(model, windows, common) -> dict:
    sweep = intervention_sweep(model, windows, GRID, scope="model", controls=16, **common)
    record = {"clean_nll": sweep.nll_clean()}
    for mode in sweep.modes:
        record[f"relative_{mode}"] = sweep.relative(mode)[0, 0].tolist()
        low, high = sweep.ci(mode, relative=True)
        record[f"relative_ci_{mode}"] = [low[0, 0].tolist(), high[0, 0].tolist()]
        record[f"relative_control_{mode}"] = sweep.relative(mode, control=True)[0, 0].tolist()
        low, high = sweep.ci(mode, relative=True, control=True)
        record[f"relative_control_ci_{mode}"] = [low[0, 0].tolist(), high[0, 0].tolist()]
    n_star = effective_set_size(model, windows, scope="model", **common)
    record["n_star_model"] = {f"{tau:g}": [n_star.n_star[t, 0, 0].item(), n_star.low[t, 0, 0].item(),
                                            n_star.high[t, 0, 0].item()] for t, tau in enumerate(n_star.taus)}
    return record, sweep


def layer_part(model, windows, common, out: Path) -> dict:
    sweep = intervention_sweep(model, windows, GRID, scope="layer", controls=0, **common)
    record = {f"relative_by_layer_{mode}": sweep.relative(mode)[:, 0].tolist() for mode in sweep.modes}
    n_star = effective_set_size(model, windows, scope="layer", **common)
    record["n_star_by_layer"] = {
        f"{tau:g}": {"n_star": n_star.n_star[t, :, 0].tolist(), "low": n_star.low[t, :, 0].tolist(),
                     "high": n_star.high[t, :, 0].tolist()} for t, tau in enumerate(n_star.taus)
    }
    geometry = analyze_corpus(model, windows, n_grid=GRID, bootstrap_fields=["precision", "recall", "f_score"],
                              n_bootstrap=BOOTSTRAP, batch_size=len(windows), progress=True)
    geometry.save(out / "geometry")
    for field in ("f_score", "precision", "recall"):
        for mode in sweep.modes:
            c = geometry_vs_dnll(geometry, sweep, field=field, mode=mode)
            record[f"spearman_{field}_{mode}"] = {"n": c.n_grid.tolist(), "rho": c.rho.tolist(),
                                                  "low": c.low.tolist(), "high": c.high.tolist()}
    return record, sweep


def main() -> None:
    out = Path(sys.argv[1])
    n_windows = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    context = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    part = sys.argv[4] if len(sys.argv) > 4 else "model"
    out.mkdir(parents=True, exist_ok=True)
    model = load_model("smollm2-135m", progress=False)
    stream = window_documents(model, lambda: [default_text()], context=context, n_windows=n_windows, min_context=None)
    windows = torch.stack([w.tokens for w in stream])
    common = dict(n_bootstrap=BOOTSTRAP, batch_size=n_windows, progress=True)
    start = time.time()
    if part == "model":
        record, sweep = model_part(model, windows, common)
    else:
        record, sweep = layer_part(model, windows, common, out)
    sweep.save(out / f"sweep_{part}")
    record.update(windows=n_windows, context=context, grid=GRID, seconds=time.time() - start)
    (out / f"record_{part}.json").write_text(json.dumps(record, indent=1))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
