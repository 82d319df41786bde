# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Top-N interventions: does the geometry predict what the model needs?
#
# Precision and Recall say how cleanly the top-N keys of an attention row
# separate from the rest in value space. Do they say anything about what the
# model *needs*? Here we cut every attention row down to its N highest-weighted
# keys and measure the change in next-token loss (dNLL):
#
# - `topn_pattern_hook`: a TransformerLens `hook_pattern` function that keeps
#   the top N visible keys of each row (`mode="delete"`: the kept weights stay
#   as they are; `mode="renormalise"`: they are rescaled to sum to 1);
# - `intervention_sweep`: dNLL for every N, mode and scope unit (the whole
#   model, one layer, one head), with random rankings of the same N as a control;
# - `effective_set_size`: N*_tau, the smallest N whose loss increase stays
#   within tau of the clean loss;
# - `geometry_vs_dnll`: Spearman's rho, across layers or heads, between F_N
#   and dNLL at the same N.
#
# Runs in a few minutes on 2 CPU cores; `TL_GEOMETRY_DEMO_SMALL=1` uses two
# short windows and four layers.

# %%
import os
import tempfile
from pathlib import Path

import torch

import tl_geometry as tg
from tl_geometry.analysis.sweep_statistics import geometry_vs_dnll
from tl_geometry.interventions.sweep import effective_set_size, intervention_sweep
from tl_geometry.interventions.topn_attention import topn_hooks, topn_pattern_hook
from tl_geometry.report.html import intervention_figures, write_report

SMALL = os.environ.get("TL_GEOMETRY_DEMO_SMALL") == "1"
CONTEXT, WINDOWS = (32, 2) if SMALL else (256, 8)
LAYERS = [0, 1, 2, 3] if SMALL else None
GRID = [1, 4, 16] if SMALL else [1, 2, 4, 8, 16, 32, 64, 128, 256]  # SMALL: the suite's quick run

model = tg.load_model(progress=False)
windows = tg.text_windows(model, tg.default_text(), context=CONTEXT, n_windows=WINDOWS)
windows.shape

# %% [markdown]
# ## The hook on its own
#
# The hook has TransformerLens's signature, so it goes straight into
# `model.hooks(...)`. Keys a query cannot see (later positions, padding, and
# keys outside a sliding window) are never kept, ties go to the earlier key,
# and rows that see N keys or fewer are left exactly as they are. `topn_hooks`
# builds one per layer with the layer's own window.

# %%
pattern = torch.tensor([[[[1.0, 0.0, 0.0], [0.6, 0.4, 0.0], [0.5, 0.2, 0.3]]]])
print(topn_pattern_hook(1, mode="delete")(pattern)[0, 0])
print(topn_pattern_hook(1, mode="renormalise")(pattern)[0, 0])

with torch.inference_mode():
    clean = model(windows[:1])
    with model.hooks(fwd_hooks=topn_hooks(model, 4, mode="renormalise")):
        cut = model(windows[:1])
print(f"max logit change with N = 4 everywhere: {(cut - clean).abs().max().item():.3f}")

# %% [markdown]
# ## dNLL against N for the whole model
#
# One clean pass per batch is shared by every setting; each (mode, N, control)
# is one more forward pass. The random controls rank the visible keys at
# random (nested across N, seeded by each document's tokens). On a GPU,
# `settings_per_pass=8` stacks eight settings along the batch of one pass
# (the same sweep, with eight times the activation memory); under `torchrun`
# each process sweeps every K-th window and all get the reduced sweep.

# %%
sweep = intervention_sweep(model, windows, GRID, scope="model", controls=2 if SMALL else 16, progress=False)
print(sweep.describe())
for mode in sweep.modes:
    low, high = sweep.ci(mode, relative=True)
    for n, mean, lo, hi, rnd in zip(GRID, sweep.relative(mode)[0, 0], low[0, 0], high[0, 0],
                                    sweep.relative(mode, control=True)[0, 0]):
        print(f"{mode:>11} N={n:<4} relative dNLL {mean:8.4f} [{lo:.4f}, {hi:.4f}]   random {rnd:8.4f}")

# %% [markdown]
# ## How many keys does the model need? N*_tau
#
# The search follows the protocol of the follow-up paper: powers of two until
# one passes, bisection, then the smallest passing N within +-3.

# %%
n_star = effective_set_size(model, windows, scope="model", taus=(0.05,), progress=False)
found, low, high = n_star.sel(0.05).item(), n_star.low[0, 0, 0].item(), n_star.high[0, 0, 0].item()
print(f"N*_5% of the model: {found:g} keys, interval [{low:g}, {high:g}]" if found == found else
      f"N*_5% of the model: not reached (no N up to {n_star.max_n} keeps the relative dNLL within 0.05)")

# %% [markdown]
# ## Geometry against function, layer by layer
#
# A layer-scope sweep cuts one layer at a time. The geometry run uses the same
# windows, seed and number of bootstrap replicates, so each bootstrap
# replicate of the correlation resamples the same documents on both sides.

# %%
layer_sweep = intervention_sweep(model, windows, GRID, scope="layer", layers=LAYERS, modes=("renormalise",),
                                 controls=0, progress=False)
geometry = tg.analyze_corpus(model, windows, n_grid=GRID, layers=LAYERS, progress=False,
                             bootstrap_fields=["precision", "recall", "f_score"])
corr = geometry_vs_dnll(geometry, layer_sweep, field="f_score")
for k, (n, rho, lo, hi) in enumerate(zip(corr.n_grid.tolist(), corr.rho.tolist(), corr.low.tolist(),
                                         corr.high.tolist())):
    why = corr.why_undefined(k)  # a missing rho says why (e.g. dNLL the same for every layer), never "nan"
    print(f"N={n:<4} Spearman(F_N, dNLL) across layers = " + (f"no value: {why}" if why else f"{rho:6.2f}  [{lo:.2f}, {hi:.2f}]"))

# %% [markdown]
# ## The figures, in the report
#
# `intervention_figures` draws dNLL against N with the control band, the N*_tau
# heatmap and the F_N-against-dNLL scatter; `write_report` puts them in a
# section of their own right after the report's summary, first in its
# contents, with the geometry of the same windows after them. (The command
# `tl-geometry intervene` does all of this.)

# %%
figures = intervention_figures(sweep, n_star, corr)
out = Path(tempfile.mkdtemp()) / "report"
index = write_report(geometry, out, {"text": "Python reference docs"}, extra_figures=figures)
print("wrote", index)
figures[0][1]
