"""Shape names shared by every module, following TransformerLens's conventions.

Axis names:
    batch       any leading axes (flattened to rows by the engine)
    pos         token position in a sequence
    head_index  attention head (query heads, after GQA alignment)
    query_pos / key_pos  axes of an attention pattern
    key         the keys visible to one query (one attention row)
    d_head      width of a value vector
    n           the selection sizes N of the grid
    layer       layer index of a per-layer-head result
    sequence    one analysed sequence (window) of a corpus
"""

from typing import Literal

from jaxtyping import Bool, Float, Int
from torch import Tensor

Ranking = Literal["attention", "contribution"]
Distance = Literal["euclidean", "cosine"]

AttentionRows = Float[Tensor, "*batch key"]
ValueRows = Float[Tensor, "*batch key d_head"]
KeyMask = Bool[Tensor, "*batch key"]
NGrid = Int[Tensor, " n"]
PerRowN = Float[Tensor, "*batch n"]

__all__ = [
    "Ranking",
    "Distance",
    "AttentionRows",
    "ValueRows",
    "KeyMask",
    "NGrid",
    "PerRowN",
    "Bool",
    "Float",
    "Int",
    "Tensor",
]
