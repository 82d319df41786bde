"""Roles against heads whose mechanism the field knows: detector scores beside the roles on the same prompts.

The scores come from `tl_geometry.roles.prompt_sets` (written from the
detectors' definitions on ``hook_pattern``, independent of the role
features); this module only reads them beside the roles.
"""

import math
import warnings
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from tl_geometry.analysis.head_roles import CONTENT, HeadRoles
from tl_geometry.errors import GeometryError
from tl_geometry.results.display import Summary, head_name, plural

DETECTORS = ("previous_token", "duplicate_token", "induction", "bos")
# A head is confirmed by a detector at this score (the usual cut of TransformerLens's head detector studies).
CONFIRMED = 0.3


def expected_subtype(detector: str, period: int | None) -> str:
    """The sub-type a head of ``detector``'s mechanism gets: previous-token, or lag T - 1 for induction."""
    if detector == "previous_token":
        return "previous-token"
    if detector == "induction":
        if period is None:
            raise GeometryError("period: the induction sub-type is lag T - 1, and this prompt set has no period T")
        return f"lag {period - 1}"
    raise GeometryError(f"detector: a sub-type is expected for previous_token and induction only, got {detector!r}")


@dataclass(frozen=True)
class DetectorAgreement:
    """The heads the roles name with a sub-type against the heads a detector confirms (score >= threshold).

    Attributes:
        subtype: the sub-type checked, e.g. ``"previous-token"``.
        named: the heads with that sub-type, ``(layer, head)``.
        detected: the heads (of those the roles covers) whose detector score is at least ``threshold``.
        threshold: the detector score that confirms.
    """

    subtype: str
    named: tuple[tuple[int, int], ...]
    detected: tuple[tuple[int, int], ...]
    threshold: float

    @property
    def confirmed(self) -> tuple[tuple[int, int], ...]:
        """The named heads the detector confirms."""
        return tuple(head for head in self.named if head in self.detected)

    @property
    def precision(self) -> float:
        """confirmed / named: is what we named really that? (NaN where no head is named)"""
        return len(self.confirmed) / len(self.named) if self.named else math.nan

    @property
    def recall(self) -> float:
        """confirmed / detected: are the heads the detector confirms found? (NaN where it confirms none)"""
        return len(self.confirmed) / len(self.detected) if self.detected else math.nan


def agreement(roles: HeadRoles, scores: Tensor, subtype: str, threshold: float = CONFIRMED) -> DetectorAgreement:
    """Heads ``roles`` names ``subtype`` and heads a detector's ``scores`` ``[layer, head]`` confirm.

    The roles may come from other prompts than the scores (e.g. the
    report's input against detectors on their own prompts): that is the check
    of a naming on text the detector did not see.
    """
    heads = [(layer, head) for layer in roles.layers for head in roles.heads]
    named = tuple(h for h in heads if roles.subtype(*h) == subtype)
    detected = tuple(h for h in heads if float(scores[h]) >= threshold)
    return DetectorAgreement(subtype, named, detected, threshold)


@dataclass(frozen=True, repr=False)  # repr: a summary, not every score and the roles' tensors
class PromptSetCheck:
    """One prompt set: detector scores and the roles found on the same prompts.

    Attributes:
        name: ``"natural"`` or ``"repeated"``.
        scores: detector name -> ``[layer, head]``.
        roles: the roles on these prompts.
        period: T for repeated prompts, else None.
        n_prompts: how many prompts the set holds (None where not recorded).
    """

    name: str
    scores: dict[str, Tensor]
    roles: HeadRoles
    period: int | None
    n_prompts: int | None = None

    @property
    def taxonomy(self) -> HeadRoles:
        """Deprecated: `roles`, under its former name."""
        warnings.warn("PromptSetCheck.taxonomy is deprecated; it is now PromptSetCheck.roles", DeprecationWarning,
                      stacklevel=2)
        return self.roles

    def _summary(self) -> Summary:
        prompts = "prompts" if self.n_prompts is None else plural(self.n_prompts, "prompt")
        rows = [("prompts", f"{prompts}, {self.name}" + (f" (random tokens repeated, period {self.period})"
                                                          if self.period else ""))]
        for detector, scores in self.scores.items():
            top = ", ".join(f"{head_name(layer, head)} {float(scores[layer, head]):.2f}"
                            for layer, head in self.top_heads(detector, 4))
            rows.append((detector, f"top scores {top}"))
        rows.append(("roles", f"{plural(self.roles.labels.numel(), 'head')} classified on these prompts "
                              "(check.roles)"))
        detector = next(iter(self.scores), "previous_token")
        rows.append(("read", f"check.cross_tab({detector!r}); check.agreement({detector!r}, your_roles)"))
        return Summary(f"PromptSetCheck {self.name!r}", tuple(rows))

    def __repr__(self) -> str:
        return self._summary().text()

    def _repr_html_(self) -> str:
        return self._summary().html()

    def top_heads(self, detector: str, k: int = 10) -> list[tuple[int, int]]:
        """The k heads with the highest score of ``detector`` (NaN last)."""
        flat = self.scores[detector].nan_to_num(-math.inf).flatten()
        n_heads = self.scores[detector].shape[1]
        return [divmod(int(i), n_heads) for i in flat.topk(min(k, flat.numel())).indices]

    def matches(self, detector: str, k: int = 10) -> int:
        """Recall: of the top-k heads of ``detector``, how many the roles place as expected.

        previous_token: Content / previous-token; induction: Content with its
        key at lag T - 1; other detectors: not defined (GeometryError).
        """
        want = expected_subtype(detector, self.period)
        return sum(self.roles.subtype(layer, head) == want for layer, head in self.top_heads(detector, k))

    def agreement(
        self, detector: str, roles: HeadRoles | None = None, threshold: float = CONFIRMED
    ) -> DetectorAgreement:
        """Precision and recall: the heads named with ``detector``'s sub-type and those its score here confirms.

        Args:
            detector: ``"previous_token"`` or ``"induction"``.
            roles: whose names to check (default: the roles on these prompts).
            threshold: the score that confirms.
        """
        return agreement(roles or self.roles, self.scores[detector], expected_subtype(detector, self.period), threshold)

    def cross_tab(self, detector: str, k: int = 10) -> list[dict[str, Any]]:
        """The top-k heads of ``detector``: layer, head (and its name, ``"L16H0"``), score, label, sub-type and
        the probability of Content."""
        rows = []
        for layer, head in self.top_heads(detector, k):
            i, j = self.roles.layers.index(layer), self.roles.heads.index(head)
            rows.append({
                "layer": layer, "head": head, "name": head_name(layer, head), "score": float(self.scores[detector][layer, head]),
                "label": self.roles.label_names()[i][j], "subtype": self.roles.subtype_text(layer, head),
                "lag": int(self.roles.subtypes.lag[i, j]),
                "p_content": float(self.roles.probabilities[i, j, CONTENT]),
            })  # fmt: skip
        return rows
