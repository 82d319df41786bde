"""The roles diagnostic's query sample: a few query positions per sequence, spread over it and seeded by its tokens.

A head's role is a property of the head, not of one query position: the
role features are measured on ``n_queries`` positions per sequence, one
drawn uniformly in each of ``n_queries`` equal strata of the positions
1..P, P the sequence's last analysed query counted from its first real
token (position 0, the sink, sees only itself). A sequence with P <
``n_queries`` gets every position 1..P. The draw comes from a generator
seeded by a SHA-256 hash of the tag ``tl_geometry.query-sample/1``, the
seed and the sequence's tokens, so that a sequence gets the same positions
in any batch, padding or process.
"""

import dataclasses
import hashlib

import torch
from jaxtyping import Int
from torch import Tensor

from tl_geometry.capture.tokens import PreparedTokens

_TAG = b"tl_geometry.query-sample/1"


def strata_positions(last: int, n_queries: int, uniform: Tensor) -> list[int]:
    """One position per stratum of 1..last: stratum j is [1 + j*last//k, (j+1)*last//k], k = min(n_queries, last).

    >>> strata_positions(8, 4, torch.zeros(4))
    [1, 3, 5, 7]
    >>> strata_positions(2, 4, torch.zeros(4))
    [1, 2]
    """
    k = min(n_queries, last)
    out = []
    for j in range(k):
        low, high = 1 + (j * last) // k, ((j + 1) * last) // k
        out.append(low + min(int(float(uniform[j]) * (high - low + 1)), high - low))
    return out


def sample_queries(prepared: PreparedTokens, n_queries: int, seed: int) -> PreparedTokens:
    """``prepared`` with its analysed queries replaced by the roles diagnostic's sample (same tokens and padding)."""
    first = prepared.real.cpu().int().argmax(-1)
    query_valid, query_index = prepared.query_valid.cpu(), prepared.query_index.cpu()
    last_valid = (query_valid.long() * (torch.arange(query_valid.shape[1]) + 1)).argmax(-1)
    last_offset = query_index.gather(1, last_valid[:, None]).squeeze(1) - first
    rows: list[list[int]] = []
    for tokens, last, any_query in zip(prepared.documents(), last_offset.tolist(), query_valid.any(-1).tolist()):
        if not any_query or last < 1:
            rows.append([])
            continue
        body = tokens.detach().cpu().to(torch.int64).numpy().astype("<i8").tobytes()
        key = hashlib.sha256(_TAG + int(seed).to_bytes(8, "little", signed=True) + body).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(key[:8], "little"))
        rows.append(strata_positions(last, n_queries, torch.rand(n_queries, dtype=torch.float64, generator=generator)))
    width = max(1, max(len(r) for r in rows))
    offsets = torch.zeros(len(rows), width, dtype=torch.long)
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        offsets[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        valid[i, : len(r)] = True
    # Rows without a sampled query point at the sequence's first token; they are masked out.
    index = first.unsqueeze(-1) + offsets
    return dataclasses.replace(
        prepared, query_index=index.to(prepared.query_index.device), query_valid=valid.to(prepared.query_valid.device)
    )


def offsets_from_first(prepared: PreparedTokens) -> Int[Tensor, "batch query"]:
    """Each analysed query's position counted from its sequence's first real token; -1 where there is none."""
    first = prepared.real.int().argmax(-1, keepdim=True)
    return (prepared.query_index - first).masked_fill(~prepared.query_valid, -1).cpu()
