"""The selection metrics as a diagnostic, always on: P, R, F-scores and radii of every analysed row."""

from typing import Any

from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.registry import Diagnostic
from tl_geometry.engine.context import SelectionChunk
from tl_geometry.engine.metrics import METRICS_COST, chunk_metrics


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
    )  # fmt: skip

    def rows(self, chunk: SelectionChunk, settings: Any) -> dict[str, Tensor]:
        return chunk_metrics(chunk)


DIAGNOSTIC = SelectionDiagnostic()
