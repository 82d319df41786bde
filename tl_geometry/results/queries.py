"""Per-query rows kept for a few prompts (``keep_queries=True``): joined along documents, padded.

Values are ``[doc, layer, head_index, query, *trailing]`` by field name, with
``query_positions`` ``[doc, query]`` (-1 where a document has fewer queries).
Joining pads the query axis and growing trailing axes with NaN (positions
with -1). Unlike every other part of a result these grow with the documents,
so they are meant for circuit work on a handful of prompts.
"""

from collections.abc import Mapping, Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from tl_geometry.errors import GeometryError

QueryRows = tuple[dict[str, Tensor], Int[Tensor, "_doc _query"]]


def _padded(t: Tensor, shape: Sequence[int], fill: int | float) -> Tensor:
    out = torch.full(tuple(shape), fill, dtype=t.dtype)
    out[tuple(slice(0, n) for n in t.shape)] = t
    return out


def check_rows(values: Mapping[str, Tensor], positions: Tensor, n_docs: int, shape: tuple[int, int]) -> None:
    """GeometryError unless the rows are ``[doc, layer, head_index, query, ...]`` matching ``positions`` ``[doc, query]``."""
    if positions.ndim != 2 or positions.is_floating_point() or positions.shape[0] != n_docs:
        raise GeometryError(
            f"query_positions: expected an integer tensor [doc, query] with {n_docs} documents, got "
            f"{positions.dtype} {list(positions.shape)}"
        )
    for name, t in values.items():
        expected = (n_docs, *shape, positions.shape[1])
        if tuple(t.shape[:4]) != expected or not t.is_floating_point():
            raise GeometryError(
                f"queries[{name!r}]: expected a float tensor [doc, layer, head_index, query, ...] starting "
                f"{list(expected)}, got {t.dtype} {list(t.shape)}"
            )


def join_rows(parts: Sequence[QueryRows]) -> QueryRows:
    """The rows of several batches (or results) as one, padded to the widest query and trailing axes."""
    parts = [p for p in parts if p[1].shape[0]] or list(parts[:1])  # a part of no documents adds nothing
    names = list(parts[0][0])
    for values, _ in parts[1:]:
        if list(values) != names:
            raise GeometryError(f"queries: the parts keep per-query rows of different fields, {names} vs {list(values)}")
    n_queries = max(positions.shape[1] for _, positions in parts)
    positions = torch.cat([_padded(p.long(), (p.shape[0], n_queries), -1) for _, p in parts])
    joined = {}
    for name in names:
        tensors = [values[name] for values, _ in parts]
        width = [max(sizes) for sizes in zip(*(t.shape[4:] for t in tensors))]
        dtype = tensors[0].dtype
        joined[name] = torch.cat([_padded(t.to(dtype), (*t.shape[:3], n_queries, *width), torch.nan) for t in tensors])
    return joined, positions
