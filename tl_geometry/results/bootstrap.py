"""Seeded Poisson bootstrap weights, one row per document, that depend only on the document.

A Poisson(1) bootstrap gives every document an independent integer weight per
replicate instead of resampling the corpus, so replicates can be accumulated
one batch at a time and merged across processes. The weights of a document
come from a private generator seeded by a SHA-256 hash of the tag
``tl_geometry.bootstrap/1``, the seed (8 bytes, little-endian, signed) and
its token ids (int64, little-endian): they do not depend on the batch the
document is in, its order, or the process that saw it. Two identical
documents get identical weights (they are the same observation).

The draws are made by inverting the Poisson(1) distribution function on
``torch.rand`` (float64) of that generator, rather than by ``torch.poisson``,
so that they stay the same across torch versions and devices.
"""

import hashlib
import math
from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tl_geometry.errors import GeometryError

_TAG = b"tl_geometry.bootstrap/1"
_INDEX_TAG = b"tl_geometry.bootstrap/sequence-index/1"  # version-1 files keep no tokens
# P(X <= k) for X ~ Poisson(1), k = 0..24; P(X > 24) < 1e-25, far below float64 draws' resolution.
_POISSON_CDF = torch.tensor(
    [sum(math.exp(-1.0) / math.factorial(j) for j in range(k + 1)) for k in range(25)], dtype=torch.float64
)


def _check_n_bootstrap(n_bootstrap: int) -> None:
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, int) or n_bootstrap < 0:
        raise GeometryError(f"n_bootstrap: expected an integer >= 0 (0: no replicates), got {n_bootstrap!r}")


def _poisson_row(key: bytes, n_bootstrap: int) -> Float[Tensor, " replicate"]:
    generator = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
    uniform = torch.rand(n_bootstrap, dtype=torch.float64, generator=generator)
    # Inverse CDF: the number of k with P(X <= k) <= u is the smallest k with u < P(X <= k).
    return torch.searchsorted(_POISSON_CDF, uniform, right=True).to(torch.float64)


def document_weights(
    # Annotated with what callers may pass: the checks below name the document that is not 1-d integer ids.
    documents: Sequence[Tensor], n_bootstrap: int, seed: int
) -> Float[Tensor, "document replicate"]:
    """Poisson(1) bootstrap weights of each document, from a hash of its tokens and the seed.

    Args:
        documents: each document's real token ids (no padding), 1-d integer tensors.
        n_bootstrap: replicates (0 gives a ``[document, 0]`` tensor).
        seed: the bootstrap seed of the run.

    Returns:
        ``[document, replicate]`` float64 integer-valued weights.

    >>> w = document_weights([torch.tensor([1, 2, 3]), torch.tensor([7])], 4, seed=0)
    >>> w.shape, bool((w == w.round()).all())
    (torch.Size([2, 4]), True)
    >>> torch.equal(w[1], document_weights([torch.tensor([7])], 4, seed=0)[0])
    True
    """
    _check_n_bootstrap(n_bootstrap)
    rows = []
    for i, tokens in enumerate(documents):
        if not isinstance(tokens, Tensor) or tokens.ndim != 1 or tokens.is_floating_point() or tokens.is_complex():
            raise GeometryError(
                f"documents[{i}]: expected a 1-d tensor of integer token ids (no padding), got "
                f"{type(tokens).__name__} {getattr(tokens, 'dtype', '')} {list(getattr(tokens, 'shape', []))}"
            )
        body = tokens.detach().cpu().to(torch.int64).numpy().astype("<i8").tobytes()
        rows.append(_poisson_row(_TAG + int(seed).to_bytes(8, "little", signed=True) + body, n_bootstrap))
    if not rows:
        return torch.zeros(0, n_bootstrap, dtype=torch.float64)
    return torch.stack(rows)


def sequence_index_weights(n_sequences: int, n_bootstrap: int, seed: int) -> Float[Tensor, "document replicate"]:
    """Poisson(1) weights for documents known only by their index (results saved in format 1 keep no tokens).

    Unlike `document_weights`, these depend on where a sequence was in its
    file, so they are only meant for converting one old file.
    """
    _check_n_bootstrap(n_bootstrap)
    rows = [
        _poisson_row(_INDEX_TAG + int(seed).to_bytes(8, "little", signed=True) + i.to_bytes(8, "little"), n_bootstrap)
        for i in range(n_sequences)
    ]
    return torch.stack(rows) if rows else torch.zeros(0, n_bootstrap, dtype=torch.float64)


_QUERY_TAG = b"tl_geometry.bootstrap/query/1"


def query_weights(
    documents: Sequence[Tensor], positions: Int[Tensor, "document query"], n_bootstrap: int, seed: int
) -> Float[Tensor, "document query replicate"]:
    """Poisson(1) weights of each query row within its document: the second stage of a two-stage bootstrap.

    A row's weights come from a hash of the tag ``tl_geometry.bootstrap/query/1``,
    the seed, its position (counted from the document's first real token) and
    the document's tokens, so that they do not depend on the batch, the
    padding or the process.

    Args:
        documents: each document's real token ids, as in `document_weights`.
        positions: the positions of its query rows, ``[document, query]`` (-1: no row).
        n_bootstrap: replicates.
        seed: the bootstrap seed of the run.

    Returns:
        ``[document, query, replicate]`` float64 integer-valued weights (0 where there is no row).

    >>> w = query_weights([torch.tensor([1, 2, 3])], torch.tensor([[1, 2, -1]]), 4, seed=0)
    >>> w.shape, w[0, 2].tolist()
    (torch.Size([1, 3, 4]), [0.0, 0.0, 0.0, 0.0])
    """
    _check_n_bootstrap(n_bootstrap)
    out = torch.zeros(*positions.shape, n_bootstrap, dtype=torch.float64)
    for i, tokens in enumerate(documents):
        body = tokens.detach().cpu().to(torch.int64).numpy().astype("<i8").tobytes()
        digest = hashlib.sha256(_QUERY_TAG + int(seed).to_bytes(8, "little", signed=True) + body).digest()
        for j, position in enumerate(positions[i].tolist()):
            if position >= 0:
                out[i, j] = _poisson_row(digest + int(position).to_bytes(8, "little"), n_bootstrap)
    return out
