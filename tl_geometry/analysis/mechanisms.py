"""Roles against heads whose mechanism the field knows: detector scores beside the roles on the same prompts.

The scores come from `tl_geometry.capture.roles` (written from the
detectors' definitions on ``hook_pattern``, independent of the role
features); this module only reads them with a taxonomy.
"""

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from tl_geometry.analysis.taxonomy import CONTENT, HeadTaxonomy
from tl_geometry.errors import GeometryError

DETECTORS = ("previous_token", "duplicate_token", "induction", "bos")


@dataclass(frozen=True)
class PromptSetCheck:
    """One prompt set: detector scores and the roles found on the same prompts.

    Attributes:
        name: ``"natural"`` or ``"repeated"``.
        scores: detector name -> ``[layer, head]``.
        taxonomy: the roles on these prompts.
        period: T for repeated prompts, else None.
        n_prompts: how many prompts the set holds (None where not recorded).
    """

    name: str
    scores: dict[str, Tensor]
    taxonomy: HeadTaxonomy
    period: int | None
    n_prompts: int | None = None

    def top_heads(self, detector: str, k: int = 10) -> list[tuple[int, int]]:
        """The k heads with the highest score of ``detector`` (NaN last)."""
        flat = self.scores[detector].nan_to_num(-math.inf).flatten()
        n_heads = self.scores[detector].shape[1]
        return [divmod(int(i), n_heads) for i in flat.topk(min(k, flat.numel())).indices]

    def matches(self, detector: str, k: int = 10) -> int:
        """Of the top-k heads of ``detector``, how many the roles place as expected.

        previous_token: Content / previous-token; induction: Content with its
        top rest key at lag T - 1; other detectors: not defined (ValueError).
        """
        found = 0
        for layer, head in self.top_heads(detector, k):
            sub = self.taxonomy.subtype(layer, head)
            if detector == "previous_token":
                found += sub == "previous-token"
            elif detector == "induction":
                found += sub == f"lag {self.period - 1}"
            else:
                raise GeometryError(f"detector: matches is defined for previous_token and induction, got {detector!r}")
        return found

    def cross_tab(self, detector: str, k: int = 10) -> list[dict[str, Any]]:
        """The top-k heads of ``detector``: score, label, sub-type and the role probabilities."""
        rows = []
        for layer, head in self.top_heads(detector, k):
            i, j = self.taxonomy.layers.index(layer), self.taxonomy.heads.index(head)
            rows.append({
                "head": f"{layer}.{head}", "score": float(self.scores[detector][layer, head]),
                "label": self.taxonomy.label_names()[i][j], "subtype": self.taxonomy.subtype_text(layer, head),
                "top_lag": int(self.taxonomy.top_lag[i, j]),
                "p_content": float(self.taxonomy.probabilities[i, j, CONTENT]),
            })  # fmt: skip
        return rows
