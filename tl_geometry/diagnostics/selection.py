"""The selection metrics as a diagnostic, always on: P, R, F-scores and radii of every analysed row.

It also records how much attention the top-N set holds (``attention_mass``),
from which a head's effective N is read after the run
(`tl_geometry.analysis.summaries.effective_n`).
"""

import math
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.registry import Diagnostic
from tl_geometry.engine.context import SelectionChunk
from tl_geometry.engine.metrics import METRICS_COST, ball_members, chunk_metrics


def top_n_attention_mass(chunk: SelectionChunk) -> Float[Tensor, "row n"]:
    """The sum of alpha_i over the top-N set of every row and N (NaN where N exceeds the visible keys).

    The top-N set is the chunk's own order (the config's ranking), so with
    ``ranking="contribution"`` this is the attention the N largest
    contributions receive. Hidden keys have alpha 0 and sort last.
    """
    cumulative = chunk.alpha.gather(-1, chunk.order).cumsum(-1)  # [row, key]: mass of the first p + 1 keys
    at = (chunk.grid - 1).clamp(max=cumulative.shape[-1] - 1)
    return cumulative[:, at].masked_fill(chunk.missing, math.nan)


def picture_rows(
    chunk: SelectionChunk, metrics: dict[str, Tensor], rows: Int[Tensor, " pick"], first_real: Int[Tensor, " pick"]
) -> list[dict[str, Any]]:
    """What a `tl_geometry.results.selection_picture.SelectionPicture` holds, for some rows of a chunk, on the CPU.

    Read from the chunk and from this diagnostic's own per-row values
    ``metrics`` (call right after `SelectionDiagnostic.rows` on the chunk, whose
    proximity plane `ball_members` reads); nothing is recomputed. Keys are
    the visible ones in increasing position (counted from ``first_real``, the
    row's first real token).
    """
    inside_max, inside_min = ball_members(chunk, rows)
    out = []
    for i, row in enumerate(rows.tolist()):
        keys = chunk.visible[row].nonzero().squeeze(-1)  # visible key indices, increasing
        k = len(keys)
        in_order = chunk.order[row, :k]  # the top-N order; hidden keys sort after the visible ones
        local = torch.searchsorted(keys, in_order)  # each ranked key's index among the visible keys
        y = torch.empty_like(chunk.y_sorted[row, :k])
        y[local] = chunk.y_sorted[row, :k]
        members = [torch.zeros(len(chunk.grid), k, dtype=torch.bool, device=keys.device) for _ in range(2)]
        for plane, inside in zip(members, (inside_max[i], inside_min[i])):
            plane[:, local] = inside[:, :k]
            plane[chunk.missing[row]] = False
        sink = int(chunk.sink[row])
        out.append({
            "sink": int(torch.searchsorted(keys, torch.tensor(sink, device=keys.device))) if sink >= 0 else -1,
            "distance": chunk.distance,
            "ranking": chunk.ranking,
            "positions": (keys - first_real[i]).cpu(),
            "alpha": chunk.alpha[row, keys].float().cpu(),
            "y": y.float().cpu(),
            "order": local.cpu(),
            "n_grid": chunk.grid.cpu(),
            "s": chunk.s[row].masked_fill(chunk.missing[row, :, None], math.nan).float().cpu(),
            **{name: metrics[name][row].float().cpu() for name in ("r_max", "r_min", "precision", "recall")},
            "in_r_max": members[0].cpu(),
            "in_r_min": members[1].cpu(),
        })  # fmt: skip
    return out


# The declarations, by name: ``result.per_head(PRECISION)`` reads a field as ``result.per_head("precision")``.
# Replicates by default only where the claims read intervals (Precision and Recall, for Figure 6); others on request.
PRECISION = FieldSpec("precision", "Precision P(r_max, N): N / (N + non-selected keys in the closed r_max ball)", ("n",),
                      bootstrap=True)
RECALL = FieldSpec("recall", "Recall R(r_min, N): selected keys in the open r_min ball / N", ("n",), bootstrap=True)
F_RMAX = FieldSpec("f_rmax", "F(r_max) = 2P / (1 + P)", ("n",))
F_RMIN = FieldSpec("f_rmin", "F(r_min) = 2R / (1 + R)", ("n",))
F_SCORE = FieldSpec("f_score", "extremal F_N = 2PR / (P + R)", ("n",))
R_MIN = FieldSpec("r_min", "distance from s(N) to the nearest non-selected key (+inf if every key is selected)", ("n",))
R_MAX = FieldSpec("r_max", "distance from s(N) to the farthest selected key", ("n",))
S_NORM = FieldSpec("s_norm", "||s(N)||, the norm of the representative vector", ("n",))
K_OUT = FieldSpec("k_out", "K_out: non-selected keys inside the closed r_max ball", ("n",))
K_IN = FieldSpec("k_in", "K_in: selected keys inside the open r_min ball", ("n",))
ATTENTION_MASS = FieldSpec("attention_mass", "attention weight on the top-N set: sum of alpha_i over it", ("n",))


class SelectionDiagnostic(Diagnostic):
    name = "selection"
    always = True
    cost = METRICS_COST
    fields = (PRECISION, RECALL, F_RMAX, F_RMIN, F_SCORE, R_MIN, R_MAX, S_NORM, K_OUT, K_IN, ATTENTION_MASS)

    def rows(self, chunk: SelectionChunk, settings: Any) -> dict[str, Tensor]:
        return {**chunk_metrics(chunk), "attention_mass": top_n_attention_mass(chunk)}


DIAGNOSTIC = SelectionDiagnostic()
