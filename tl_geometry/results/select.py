"""Indexing by real labels (layer numbers, heads, N values) and quantiles over bootstrap replicates."""

import math
import operator
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from tl_geometry.errors import GeometryError


def take(t: Tensor, axis: int, what: str, labels: tuple[int, ...], wanted: Any) -> Tensor:
    """Select real labels (layer numbers, heads, N values) on one axis: a number drops it, a list keeps it."""
    if wanted is None:
        return t
    scalar = not isinstance(wanted, (list, tuple, range, Tensor, np.ndarray)) or (
        isinstance(wanted, (Tensor, np.ndarray)) and wanted.ndim == 0
    )
    items = [wanted] if scalar else (wanted.tolist() if isinstance(wanted, (Tensor, np.ndarray)) else list(wanted))
    positions = []
    for item in items:
        try:
            positions.append(labels.index(operator.index(item)))
        except (TypeError, ValueError):
            raise GeometryError(f"{what}: {item!r} is not one of this result's {what}s {list(labels)}") from None
    if scalar:
        return t.select(axis, positions[0])
    return t.index_select(axis, torch.tensor(positions, dtype=torch.long))


def nanquantile(x: Float[Tensor, "replicate *rest"], q: float) -> Float[Tensor, "*rest"]:
    """Quantile ``q`` over the first axis with linear interpolation, NaN skipped (NaN if all are).

    Written with a sort because ``torch.nanquantile`` refuses inputs of more
    than 2**24 elements (replicates of a per-position field reach that).
    """
    ordered = x.sort(dim=0).values  # NaN sorts last
    n = (~x.isnan()).sum(0)
    rank = q * (n - 1).clamp_min(0).double()
    low, high = rank.floor().long(), rank.ceil().long()
    below = ordered.gather(0, low.unsqueeze(0)).squeeze(0)
    above = ordered.gather(0, high.unsqueeze(0)).squeeze(0)
    # below == above (inf included) needs no interpolation; inf - inf would be NaN.
    value = torch.where(below == above, below, below + (above - below) * (rank - low))
    return value.masked_fill(n == 0, math.nan)
