"""Pictures of one head's selection (``picture_heads``): Figure 1 on real data, one query row per head.

For every head named in `tl_geometry.GeometryConfig.picture_heads` a run
keeps one row: the last analysed query of one document, with what the
selection context and the selection diagnostic computed for it (the
contributions y_i = alpha_i v_i of the keys the query can see, the top-N
order, s(N), r_max, r_min, P, R and which keys lie inside each ball, for
every N of the grid). Nothing is recomputed after the run.

Which document: the one with the smallest `document_hash` (SHA-256 of its
token ids) among those analysed, so that batches, processes and merged
results keep the same row in any order or grouping (`pick`), and memory stays
one row per head however many documents are analysed.
"""

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry.errors import GeometryError
from tl_geometry.results.stats import same_values

_TAG = b"tl_geometry.picture/1"
# Arrays of a picture, by name: (dtype kind, axes over "key", "n", "d_head").
ARRAYS: dict[str, tuple[str, tuple[str, ...]]] = {
    "positions": ("int", ("key",)),
    "alpha": ("float", ("key",)),
    "y": ("float", ("key", "d_head")),
    "order": ("int", ("key",)),
    "n_grid": ("int", ("n",)),
    "s": ("float", ("n", "d_head")),
    "r_max": ("float", ("n",)),
    "r_min": ("float", ("n",)),
    "precision": ("float", ("n",)),
    "recall": ("float", ("n",)),
    "in_r_max": ("bool", ("n", "key")),
    "in_r_min": ("bool", ("n", "key")),
}
SCALARS = ("layer", "head", "document", "query_position", "sink", "distance", "ranking")


def document_hash(tokens: Int[Tensor, " pos"]) -> int:
    """A 63-bit hash of a document's real token ids (int64, little-endian), the same on every machine.

    >>> document_hash(torch.tensor([0, 5, 7])) == document_hash(torch.tensor([0, 5, 7]))
    True
    """
    body = tokens.detach().cpu().to(torch.int64).numpy().astype("<i8").tobytes()
    return int.from_bytes(hashlib.sha256(_TAG + body).digest()[:8], "little") >> 1


@dataclass(frozen=True, eq=False)
class SelectionPicture:
    """One query row of one head, as the run measured it: Figure 1 on real data.

    Keys are the ones the query can see (causal, not padding, inside the
    layer's sliding window), in increasing position; ``[n]`` arrays follow the
    result's grid, NaN (membership False) where N exceeds the visible keys.

    Attributes:
        layer, head: the head.
        document: `document_hash` of the document the row comes from.
        query_position: the query's position, counted from the document's first real token.
        sink: index (into the keys) of the sink, -1 where the query cannot see it.
        distance, ranking: the run's distance and ranking.
        positions: each key's position from the first real token, ``[key]``.
        alpha: attention weights, ``[key]``.
        y: contributions y_i = alpha_i v_i, ``[key, d_head]``.
        order: key indices (into ``positions``) by decreasing score, ties by
            increasing position: the top-N set is ``order[:N]``, ``[key]``.
        n_grid: the selection sizes N, ``[n]``.
        s: s(N), the sum of y_i over the top-N set, ``[n, d_head]``.
        r_max, r_min: the radii of the two balls around s(N), ``[n]``.
        precision, recall: P(r_max, N) and R(r_min, N), ``[n]``.
        in_r_max: keys inside the closed r_max ball, ``[n, key]``.
        in_r_min: keys inside the open r_min ball, ``[n, key]``.
    """

    layer: int
    head: int
    document: int
    query_position: int
    sink: int
    distance: str
    ranking: str
    positions: Int[Tensor, " key"]
    alpha: Float[Tensor, " key"]
    y: Float[Tensor, "key d_head"]
    order: Int[Tensor, " key"]
    n_grid: Int[Tensor, " n"]
    s: Float[Tensor, "n d_head"]
    r_max: Float[Tensor, " n"]
    r_min: Float[Tensor, " n"]
    precision: Float[Tensor, " n"]
    recall: Float[Tensor, " n"]
    in_r_max: Bool[Tensor, "n key"]
    in_r_min: Bool[Tensor, "n key"]

    def __post_init__(self) -> None:
        what = f"picture of layer {self.layer}, head {self.head}"
        for name in ("layer", "head", "document", "query_position", "sink"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (-1 if name == "sink" else 0):
                raise GeometryError(f"{what}: {name} is {value!r}, expected a non-negative integer")
        sizes = {"key": len(self.positions), "n": len(self.n_grid), "d_head": self.y.shape[-1] if self.y.ndim else -1}
        for name, (kind, axes) in ARRAYS.items():
            t = getattr(self, name)
            ok = {"int": not t.is_floating_point() and t.dtype != torch.bool, "bool": t.dtype == torch.bool,
                  "float": t.is_floating_point()}[kind]
            expected = [sizes[a] for a in axes]
            if not ok or list(t.shape) != expected:
                raise GeometryError(f"{what}: {name} is {t.dtype} {list(t.shape)}, expected {kind} {expected} "
                                    f"({' x '.join(axes)})")
        if sizes["key"] < 1 or not self.sink < sizes["key"]:
            raise GeometryError(f"{what}: {sizes['key']} keys with sink {self.sink}; expected at least one key and "
                                "the sink among them (or -1)")
        if sorted(self.order.tolist()) != list(range(sizes["key"])):
            raise GeometryError(f"{what}: order is not a permutation of the {sizes['key']} keys")

    def __repr__(self) -> str:
        return (f"SelectionPicture(layer={self.layer}, head={self.head}, query_position={self.query_position}, "
                f"n_keys={self.n_keys}, d_head={self.y.shape[-1]}, n_grid={self.n_grid.tolist()})")

    @property
    def n_keys(self) -> int:
        """Keys the query can see."""
        return len(self.positions)

    def n_index(self, n: int) -> int:
        """Position of ``n`` on the grid, or GeometryError listing the N this picture can show."""
        matches = (self.n_grid == n).nonzero()
        if len(matches) == 0 or n > self.n_keys:
            shown = [m for m in self.n_grid.tolist() if m <= self.n_keys]
            raise GeometryError(f"n: this picture (layer {self.layer}, head {self.head}, {self.n_keys} visible keys) "
                                f"has no top-N set for N = {n}; choose one of {shown}")
        return int(matches[0, 0])

    def selected(self, n: int) -> Bool[Tensor, " key"]:
        """The top-N keys (``order[:N]``) as a mask over the keys."""
        self.n_index(n)
        mask = torch.zeros(self.n_keys, dtype=torch.bool)
        mask[self.order[:n]] = True
        return mask

    def sort_key(self) -> tuple[int, int, int]:
        """What `pick` compares: the document hash, then (for identical documents) the query and key count."""
        return (self.document, self.query_position, self.n_keys)

    def equals(self, other: "SelectionPicture") -> bool:
        """Exact equality, NaN equal to NaN."""
        if any(getattr(self, s) != getattr(other, s) for s in SCALARS):
            return False
        return all(same_values(getattr(self, name), getattr(other, name)) for name in ARRAYS)

    def arrays(self) -> dict[str, Tensor]:
        """The tensors, by name (``ARRAYS``)."""
        return {name: getattr(self, name) for name in ARRAYS}

    def metadata(self) -> dict[str, Any]:
        """The scalars, JSON-ready."""
        return {name: getattr(self, name) for name in SCALARS}

    @classmethod
    def from_parts(cls, meta: Mapping[str, Any], arrays: Mapping[str, Any]) -> "SelectionPicture":
        """Inverse of `metadata` and `arrays` (GeometryError if a part is missing or malformed)."""
        missing = [k for k in (*SCALARS, *ARRAYS) if k not in (*meta, *arrays)]
        if missing:
            raise GeometryError(f"picture: missing {missing}")
        if not isinstance(meta["distance"], str) or not isinstance(meta["ranking"], str):
            raise GeometryError(f"picture: distance and ranking must be names, got {meta['distance']!r}, {meta['ranking']!r}")
        return cls(**{name: meta[name] for name in SCALARS}, **{name: arrays[name] for name in ARRAYS})


def pick(*groups: Iterable[SelectionPicture]) -> dict[tuple[int, int], SelectionPicture]:
    """One picture per (layer, head): the one of the smallest `SelectionPicture.sort_key`.

    The rule depends only on the pictures, not on their order, so merging is
    commutative and associative.
    """
    out: dict[tuple[int, int], SelectionPicture] = {}
    for group in groups:
        for p in group:
            key = (p.layer, p.head)
            if key not in out or p.sort_key() < out[key].sort_key():
                out[key] = p
    return dict(sorted(out.items()))
