"""The selection metrics as a diagnostic, always on: P, R, F-scores and radii of every analysed row.

It also records how much attention the top-N set holds (``attention_mass``),
from which a head's effective N is read after the run
(`tl_geometry.analysis.summaries.effective_n`).
"""

import math
from typing import Any

from jaxtyping import Float
from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.registry import Diagnostic
from tl_geometry.engine.context import SelectionChunk
from tl_geometry.engine.metrics import METRICS_COST, chunk_metrics


def top_n_attention_mass(chunk: SelectionChunk) -> Float[Tensor, "row n"]:
    """The sum of alpha_i over the top-N set of every row and N (NaN where N exceeds the visible keys).

    The top-N set is the chunk's own order (the config's ranking), so with
    ``ranking="contribution"`` this is the attention the N largest
    contributions receive. Hidden keys have alpha 0 and sort last.
    """
    cumulative = chunk.alpha.gather(-1, chunk.order).cumsum(-1)  # [row, key]: mass of the first p + 1 keys
    at = (chunk.grid - 1).clamp(max=cumulative.shape[-1] - 1)
    return cumulative[:, at].masked_fill(chunk.missing, math.nan)


class SelectionDiagnostic(Diagnostic):
    name = "selection"
    always = True
    cost = METRICS_COST
    fields = (
        # Replicates by default only where the report shows intervals (Recall, for Figure 6); others on request.
        FieldSpec("precision", "Precision P(r_max, N): N / (N + non-selected keys in the closed r_max ball)", ("n",)),
        FieldSpec("recall", "Recall R(r_min, N): selected keys in the open r_min ball / N", ("n",), bootstrap=True),
        FieldSpec("f_rmax", "F(r_max) = 2P / (1 + P)", ("n",)),
        FieldSpec("f_rmin", "F(r_min) = 2R / (1 + R)", ("n",)),
        FieldSpec("f_score", "extremal F_N = 2PR / (P + R)", ("n",)),
        FieldSpec("r_min", "distance from s(N) to the nearest non-selected key (+inf if every key is selected)", ("n",)),
        FieldSpec("r_max", "distance from s(N) to the farthest selected key", ("n",)),
        FieldSpec("s_norm", "||s(N)||, the norm of the representative vector", ("n",)),
        FieldSpec("k_out", "K_out: non-selected keys inside the closed r_max ball", ("n",)),
        FieldSpec("k_in", "K_in: selected keys inside the open r_min ball", ("n",)),
        FieldSpec("attention_mass", "attention weight on the top-N set: sum of alpha_i over it", ("n",)),
    )  # fmt: skip

    def rows(self, chunk: SelectionChunk, settings: Any) -> dict[str, Tensor]:
        return {**chunk_metrics(chunk), "attention_mass": top_n_attention_mass(chunk)}


DIAGNOSTIC = SelectionDiagnostic()
