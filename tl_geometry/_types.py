"""The string options shared by several modules, and the axis names every shape annotation uses.

Axis names (TransformerLens's where it has one):
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

Ranking = Literal["attention", "contribution"]
Distance = Literal["euclidean", "cosine"]
