"""The selection context: one per analysed layer, read by every diagnostic.

For every analysed (sequence, head, query) row it holds the attention row,
the value vectors its head reads (under grouped-query attention its KV
head's: kept once per KV head, gathered per row), the keys the query can
see (causal, padding, sliding window), the sink (the sequence's first real
token when the query can see it, else none), and, chunk by chunk, the
top-N order under the config's ranking with the sums s(N) of
y_i = alpha_i v_i. The order is computed once per row here; metrics,
bounds and role features read it, and none of them sorts or chunks on
its own.

Chunks: rows are processed in slices whose working memory fits the budget
and whose ``[row, n, key]`` planes stay cache-sized. Each diagnostic
declares the extra memory it needs per row (`RowCost`), so one chunk size
serves them all. The buffers of a chunk are reused by the next one: what a
diagnostic reads from a chunk is valid until the iteration moves on. The
rows are sorted in blocks of whole chunks, as many as the rest of the budget
holds, because one sort of many rows runs on every core.
"""

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry._types import Distance, Ranking
from tl_geometry.errors import GeometryError

# Chunks whose [row, n, key] planes fit in the last-level cache run the counting
# passes several times faster than larger ones (measured on 2-core EPYC machines
# with 32 MiB L3: about 10x between 4 MiB and 100 MiB chunks).
CACHE_FRIENDLY_BYTES = 4 * 2**20

# Cosine guard of every cosine in the package: <a, b> / (||a|| ||b|| + 1e-12), 0 for a zero vector.
COSINE_EPS = 1e-12


def working_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (never less than float32)."""
    if any(t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


@dataclass(frozen=True)
class RowCost:
    """Working memory a diagnostic needs per row of a chunk, in elements of the working dtype.

    ``per_row(n_keys, n_grid, d_head)`` is the number of floats; the context
    adds them up over the active diagnostics.
    """

    key_d: int = 0  # multiples of key x d_head
    n_key: int = 0  # multiples of n x key
    key_key: float = 0.0  # multiples of key x key (e.g. cosine blocks)
    key: int = 0  # multiples of key (e.g. a tile of a fixed number of columns against every key)

    def per_row(self, n_keys: int, n_grid: int, d_head: int) -> float:
        return (self.key_d * n_keys * d_head + self.n_key * n_grid * n_keys + self.key_key * n_keys * n_keys
                + self.key * n_keys)


# The chunk's own tensors: its value vectors and y sorted (2 x key x d_head), s(N) (n x d_head).
CORE_COST = RowCost(key_d=2)


@dataclass
class SelectionChunk:
    """The sorted core of a slice of rows; every tensor is ``[row, ...]``.

    Attributes:
        batch, head, query: where each row comes from (indices into the
            context's batch, head and query axes).
        alpha: attention weights in the working dtype, hidden keys 0, ``[row, key]``.
        values: value vectors of the row's head in the working dtype, ``[row, key, d_head]``
            (gathered from ``value_source`` on first use: the core reads them sorted, straight from the source).
        value_source: the context's value states, ``[batch, key, value_head, d_head]``.
        value_head: the value head each row reads (its KV head under grouped-query attention), ``[row]``.
        visible: keys the query can see, ``[row, key]``.
        n_visible: number of visible keys, ``[row]``.
        sink: key index of the sink, -1 where the query cannot see it, ``[row]``.
        last_key: key index of the query's own position (the last visible key), ``[row]``.
        order: key indices by decreasing score, ties by increasing key index,
            hidden keys last, ``[row, key]``.
        rank: the inverse of ``order``: each key's rank, ``[row, key]``.
        y_sorted: y_i = alpha_i v_i in selection order, ``[row, key, d_head]``.
        s: s(N) for every N of the grid (clamped to the keys), ``[row, n, d_head]``.
        s_norm: ||s(N)||, ``[row, n]``.
        missing: N exceeds the visible keys (no top-N set), ``[row, n]``.
        grid: the selection sizes N, ``[n]``.
        ranking, distance: the config's ranking and distance.
        buffers: the reused memory behind the large tensors (see `scratch`).
    """

    batch: Int[Tensor, " row"]
    head: Int[Tensor, " row"]
    query: Int[Tensor, " row"]
    alpha: Float[Tensor, "row key"]
    value_source: Float[Tensor, "batch key value_head d_head"]
    value_head: Int[Tensor, " row"]
    visible: Bool[Tensor, "row key"]
    n_visible: Int[Tensor, " row"]
    sink: Int[Tensor, " row"]
    last_key: Int[Tensor, " row"]
    order: Int[Tensor, "row key"]
    rank: Int[Tensor, "row key"]
    y_sorted: Float[Tensor, "row key d_head"]
    s: Float[Tensor, "row n d_head"]
    s_norm: Float[Tensor, "row n"]
    missing: Bool[Tensor, "row n"]
    grid: Int[Tensor, " n"]
    ranking: str
    distance: str
    buffers: "_Buffers"

    @property
    def n_rows(self) -> int:
        return self.alpha.shape[0]

    @cached_property
    def values(self) -> Float[Tensor, "row key d_head"]:
        return self.value_source[self.batch, :, self.value_head].to(self.alpha.dtype)

    def value_of(self, key: Int[Tensor, " row"]) -> Float[Tensor, "row d_head"]:
        """The value vector of one key per row (``values[row, key[row]]``), gathered from the source alone: not the
        whole key axis `values` copies (32,768 x d_head per row at Gemma-3's full context)."""
        return self.value_source[self.batch, key, self.value_head].to(self.alpha.dtype)

    @property
    def has_sink(self) -> Bool[Tensor, " row"]:
        return self.sink >= 0

    def sink_rank(self) -> Int[Tensor, " row"]:
        """The sink's rank in the order; the number of keys (never selected) where there is no sink."""
        rows = torch.arange(self.n_rows, device=self.sink.device)
        ranks = self.rank[rows, self.sink.clamp(min=0)]
        return torch.where(self.has_sink, ranks, self.alpha.shape[-1])

    def seen_ranks(self) -> int:
        """The most keys a row of the chunk sees (at least 1): hidden keys sort last, so every rank from here on
        is hidden in every row and carries nothing (a sliding-window row of a long context sees a few hundred of
        its keys). Per-rank work can stop here."""
        return max(1, int(self.n_visible.max())) if self.n_rows else 1

    def seen_sizes(self) -> Bool[Tensor, " n"]:
        """Which N of the grid some row of the chunk can select (N <= `seen_ranks`); every row misses the rest."""
        return self.grid <= self.seen_ranks()

    def scratch(self, name: str, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> Tensor:
        """A reused, uninitialised ``[row, *shape]`` buffer (valid until the next chunk); working dtype by default."""
        return self.buffers.scratch(name, self.n_rows, shape, dtype)


def selection_order(
    alpha: Float[Tensor, "row key"],
    values: Float[Tensor, "row key d_head"] | None,
    visible: Bool[Tensor, "row key"],
    ranking: Ranking,
) -> Int[Tensor, "row key"]:
    """Key indices sorted by decreasing score, ties by increasing key index; hidden keys sort last.

    Score: the attention weight (``"attention"``) or the contribution
    alpha_i ||v_i|| (``"contribution"``, the only one that reads ``values``).

    >>> selection_order(torch.tensor([[0.2, 0.5, 0.5]]), torch.ones(1, 3, 1), torch.tensor([[True] * 3]), "attention")
    tensor([[1, 2, 0]])
    """
    score = alpha if ranking == "attention" else alpha * torch.linalg.vector_norm(values, dim=-1)  # type: ignore[arg-type]
    score = score.masked_fill(~visible, -math.inf)
    # A stable descending sort keeps equal scores in increasing key order.
    return torch.sort(score, dim=-1, descending=True, stable=True).indices


class SelectionContext:
    """One layer's analysed rows and their sorted top-N core, built once and shared.

    Args:
        pattern: the attention pattern the rows are read from, ``[batch, pattern_head, query_pos, key_pos]``
            (the model's own tensor: rows are gathered chunk by chunk, never copied whole;
            any values at hidden keys, they are zeroed here).
        values: value states, ``[batch, key, head_index, d_head]``, or with ``value_heads``
            ``[batch, key, value_head, d_head]`` (as the model keeps them: no copy per query head).
        visible: keys each query can see, ``[batch, query, key]`` (the same for every head).
        sink: key index of each query's sink, -1 where it cannot see one, ``[batch, query]``.
        query_valid: False where a sequence has no such query, ``[batch, query]``.
        grid: selection sizes N, ``[n]``.
        ranking: as in `tl_geometry.GeometryConfig`.
        distance: as in `tl_geometry.GeometryConfig`.
        memory_budget_mib: working memory of one chunk.
        costs: the extra per-row memory of each active diagnostic.
        query_index: position of each analysed query on the pattern's query axis, ``[batch, query]``
            (default: its index on the query axis).
        heads: the pattern head of each analysed head, ``[head_index]`` (default: every head).
        label: names the source (e.g. the hook) in error messages.
        real: real (not padding) positions, ``[batch, key]`` (default: all).
        kv_heads: the KV head each analysed head reads (None: every head its own), for statistics of the
            values alone, computed once per KV head.
        value_heads: the index on ``values``' head axis that each analysed head reads, ``[head_index]``
            (None: ``values`` is per analysed head).
    """

    def __init__(
        self,
        pattern: Float[Tensor, "batch pattern_head query_pos key_pos"],
        values: Float[Tensor, "batch key value_head d_head"],
        visible: Bool[Tensor, "batch query key"],
        sink: Int[Tensor, "batch query"],
        query_valid: Bool[Tensor, "batch query"],
        grid: Int[Tensor, " n"],
        *,
        ranking: Ranking = "attention",
        distance: Distance = "euclidean",
        memory_budget_mib: float = 128.0,
        costs: Sequence[RowCost] = (),
        query_index: Int[Tensor, "batch query"] | None = None,
        real: Bool[Tensor, "batch key"] | None = None,
        kv_heads: Int[Tensor, " head_index"] | None = None,
        heads: Int[Tensor, " head_index"] | None = None,
        value_heads: Int[Tensor, " head_index"] | None = None,
        label: str = "attention",
    ) -> None:
        device = pattern.device
        self.dtype = working_dtype(pattern, values)
        self.pattern = pattern
        self.label = label
        # Contiguous (a copy only for a strided input): the core gathers sorted vectors as rows of a flat view.
        self.value_states = values.contiguous()
        self.visible = visible
        self.sink = sink
        self.query_valid = query_valid
        self.grid = grid.to(device)
        self.ranking = ranking
        self.distance = distance
        self.memory_budget_mib = float(memory_budget_mib)
        self.costs = tuple(costs)
        n_batch, n_queries, n_keys = visible.shape
        self.value_heads = (value_heads if value_heads is not None else torch.arange(values.shape[2])).to(device)
        n_heads = len(self.value_heads)
        self._per_head = value_heads is None
        self.n_keys = n_keys
        self.heads = heads.to(device) if heads is not None else torch.arange(n_heads, device=device)
        self.query_index = (
            query_index if query_index is not None else torch.arange(n_queries, device=device).expand(n_batch, -1)
        )
        self.real = real if real is not None else torch.ones(n_batch, n_keys, dtype=torch.bool, device=device)
        self.kv_heads = kv_heads
        # Rows in (batch, head, query) order, valid queries only.
        b, q = query_valid.nonzero(as_tuple=True)
        heads = torch.arange(n_heads, device=device)
        self.row_batch = b.repeat_interleave(n_heads)
        self.row_head = heads.repeat(len(b))
        self.row_query = q.repeat_interleave(n_heads)
        # s(N) by grid segment: rank p belongs to the segment of the smallest N > p (the grid may be unsorted
        # or repeat values); the segment after the largest N holds the ranks never selected.
        bounds, self._segment_of_n = torch.unique(self.grid.clamp(max=n_keys), sorted=True, return_inverse=True)
        self._segment_of_rank = torch.bucketize(torch.arange(n_keys, device=device), bounds - 1)
        self.n_segments = len(bounds) + 1

    @property
    def n_rows(self) -> int:
        return len(self.row_batch)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(batch, head_index, query, key)."""
        return (self.visible.shape[0], len(self.heads), self.visible.shape[1], self.n_keys)

    @property
    def d_head(self) -> int:
        return self.value_states.shape[-1]

    @cached_property
    def values(self) -> Float[Tensor, "batch key head_index d_head"]:
        """The value states of every analysed head (a copy per query head under grouped-query attention)."""
        return self.value_states if self._per_head else self.value_states[:, :, self.value_heads]

    def _chunk_row_bytes(self) -> int:
        """Working memory of one row of a chunk: the core's and every diagnostic's."""
        n_keys, n_grid, itemsize = self.n_keys, len(self.grid), self.dtype.itemsize
        # Summed, not the largest: reused scratch planes of one diagnostic stay allocated while the next runs.
        extra = sum(cost.per_row(n_keys, n_grid, self.d_head) for cost in self.costs)
        return int(itemsize * (CORE_COST.per_row(n_keys, n_grid, self.d_head) + 2 * n_grid * self.d_head + extra))

    def chunk_rows(self) -> int:
        """Rows per chunk: cache-sized planes, within the memory budget for the core and every diagnostic."""
        within_budget = int(self.memory_budget_mib * 2**20 // max(self._chunk_row_bytes(), 1))
        cache_sized = CACHE_FRIENDLY_BYTES // (self.dtype.itemsize * len(self.grid) * self.n_keys)
        return max(1, min(within_budget, cache_sized))

    def sort_block_rows(self) -> int:
        """Rows sorted at once: whole chunks, as many as the budget left by one chunk holds (a sort of many
        rows runs on every core, one of a cache-sized chunk on one: about twice as fast per row on two cores)."""
        size = self.chunk_rows()
        if self.ranking == "contribution":  # its scores read the rows' values whole: sorted chunk by chunk
            return size
        # Per row and key at the sort's peak: alpha as read, masked, as scores and sorted; the sort's indices and
        # the order; the visible mask.
        per_row = self.n_keys * (4 * self.dtype.itemsize + 2 * 8 + 1)
        left = self.memory_budget_mib * 2**20 - size * self._chunk_row_bytes()
        return size * max(1, int(left // per_row) // size)

    def chunks(self) -> Iterator[SelectionChunk]:
        """The rows in chunks, each row sorted once; buffers are reused from one chunk to the next."""
        size = self.chunk_rows()
        buffers = _Buffers(min(size, self.n_rows), self.n_keys, self.d_head, len(self.grid), self.n_segments, self.dtype,
                           self.pattern.device)
        block = self.sort_block_rows()
        for block_start in range(0, self.n_rows, block):
            rows = slice(block_start, block_start + block)
            sorted_rows = self._sorted_rows(self.row_batch[rows], self.row_head[rows], self.row_query[rows])
            for start in range(0, len(sorted_rows.batch), size):
                yield self._chunk(sorted_rows.slice(slice(start, start + size)), buffers)

    def last_query_index(self) -> Int[Tensor, " batch"]:
        """Each sequence's last analysed valid query, as an index on the context's query axis."""
        positions = torch.arange(self.query_valid.shape[1], device=self.query_valid.device)
        return (self.query_valid.long() * (positions + 1)).argmax(-1)

    def last_query(
        self,
    ) -> tuple[Float[Tensor, "batch head_index key"], Bool[Tensor, "batch key"], Int[Tensor, " batch"], Int[Tensor, " batch"]]:
        """Each sequence's last analysed valid query: its attention rows (hidden keys 0), visible keys, sink and position."""
        last = self.last_query_index()
        batch = torch.arange(self.visible.shape[0], device=self.pattern.device)
        visible = self.visible[batch, last]
        position = self.query_index[batch, last]
        alpha = self.pattern[batch[:, None], self.heads[None, :], position[:, None], : self.n_keys]
        alpha = self._checked(alpha.to(self.dtype), visible[:, None, :])
        return alpha.masked_fill(~visible[:, None, :], 0.0), visible, self.sink[batch, last], position

    def _checked(self, alpha: Tensor, visible: Tensor) -> Tensor:
        """The rows, or GeometryError if the model gave NaN or Inf weights on keys a query can see."""
        # amax/amin propagate NaN: a cheap test that allocates nothing of the input's size.
        if not (torch.isfinite(alpha.amax()) and torch.isfinite(alpha.amin())):
            if not bool(torch.isfinite(alpha[visible.expand_as(alpha)]).all()):
                raise GeometryError(
                    f"{self.label}: the model returned NaN or Inf attention weights on real query rows over visible "
                    "keys. A raw TransformerBridge over Llama in float64 does this with left padding (fully masked "
                    "pad rows turn NaN and spread); pass text or right-padded tokens, run in float32, or call "
                    "model.enable_compatibility_mode()"
                )
        return alpha

    def sequence_parts(self, bytes_per_sequence: int) -> list[slice]:
        """The sequences (batch axis) in consecutive slices whose working memory, ``bytes_per_sequence`` each,
        fits the budget (one sequence at least): the per-sequence diagnostics' chunks, as the rows' are for the rows."""
        size = max(1, int(self.memory_budget_mib * 2**20 // max(bytes_per_sequence, 1)))
        return [slice(start, start + size) for start in range(0, self.visible.shape[0], size)]

    def from_first_real(
        self, x: Float[Tensor, "batch head_index key *rest"], part: slice = slice(None)
    ) -> Float[Tensor, "batch head_index key *rest"]:
        """Per-position values shifted so that each sequence's first real token (the sink) sits at position 0.

        Per-position outputs count positions from the sink, whatever the
        padding; positions past a left-padded row's end become NaN. ``x`` holds
        the sequences ``part`` of the batch (default: all).
        """
        first = self.real[part].int().argmax(-1)  # [batch]
        if not bool(first.any()):
            return x
        n_keys = x.shape[2]
        index = torch.arange(n_keys, device=x.device) + first[:, None]  # [batch, key]
        inside = index < n_keys
        index = index.clamp(max=n_keys - 1)[:, None, :].expand(x.shape[0], x.shape[1], n_keys)
        index = index.reshape(*index.shape, *([1] * (x.ndim - 3))).expand_as(x)
        shifted = x.gather(2, index)
        return shifted.masked_fill(~inside.reshape(x.shape[0], 1, n_keys, *([1] * (x.ndim - 3))), math.nan)

    def _sorted_rows(self, batch: Tensor, head: Tensor, query: Tensor) -> "_SortedRows":
        """The attention rows of (batch, head, query), hidden keys 0, and their selection order."""
        visible = self.visible[batch, query]
        alpha = self.pattern[batch, self.heads[head], self.query_index[batch, query], : self.n_keys].to(self.dtype)
        alpha = self._checked(alpha, visible).masked_fill(~visible, 0.0)
        # Only the contribution ranking reads the row's values whole; the attention ranking's core reads them
        # sorted, gathered straight from the source (one copy of [row, key, d_head] instead of two).
        value_head = self.value_heads[head]
        values = self.value_states[batch, :, value_head].to(self.dtype) if self.ranking == "contribution" else None
        order = selection_order(alpha, values, visible, self.ranking)  # type: ignore[arg-type]
        return _SortedRows(batch, head, query, value_head, visible, alpha, values, order)

    def _chunk(self, rows: "_SortedRows", buffers: "_Buffers") -> SelectionChunk:
        batch, head, query, value_head = rows.batch, rows.head, rows.query, rows.value_head
        visible, alpha, values, order = rows.visible, rows.alpha, rows.values, rows.order
        n_rows, n_keys = len(batch), self.n_keys
        keys = torch.arange(n_keys, device=order.device)
        rank = torch.empty_like(order).scatter_(1, order, keys.expand_as(order))
        y_sorted = buffers.y_sorted[:n_rows]
        _, _, n_value_heads, d_head = self.value_states.shape
        at = ((batch[:, None] * n_keys + order) * n_value_heads + value_head[:, None]).reshape(-1)
        flat = self.value_states.view(-1, d_head)
        if flat.dtype == y_sorted.dtype:  # index_select of whole rows: several times faster than 3-axis indexing
            torch.index_select(flat, 0, at, out=y_sorted.view(-1, d_head))
        else:
            y_sorted.view(-1, d_head).copy_(flat.index_select(0, at))
        y_sorted.mul_(alpha.gather(1, order).unsqueeze(-1))
        # s(N): the sums over the ranks between consecutive grid values (one pass over the keys, where a
        # prefix sum over the key axis took three times as long), accumulated; N beyond the keys is missing.
        segments = buffers.segments[:n_rows].zero_().index_add_(1, self._segment_of_rank, y_sorted)
        s = torch.index_select(segments.cumsum(1), 1, self._segment_of_n, out=buffers.s[:n_rows])
        n_visible = visible.sum(-1)
        last_key = (visible.long() * (keys + 1)).argmax(-1)
        chunk = SelectionChunk(
            batch=batch,
            head=head,
            query=query,
            alpha=alpha,
            value_source=self.value_states,
            value_head=value_head,
            visible=visible,
            n_visible=n_visible,
            sink=self.sink[batch, query],
            last_key=last_key,
            order=order,
            rank=rank,
            y_sorted=y_sorted,
            s=s,
            s_norm=torch.linalg.vector_norm(s, dim=-1),
            missing=self.grid.unsqueeze(0) > n_visible.unsqueeze(-1),
            grid=self.grid,
            ranking=self.ranking,
            distance=self.distance,
            buffers=buffers,
        )
        if values is not None:
            chunk.__dict__["values"] = values  # the cached_property's slot: gathered once
        return chunk


class _SortedRows(NamedTuple):
    """Rows of a context with their attention weights and selection order, sorted together and sliced into chunks."""

    batch: Tensor
    head: Tensor
    query: Tensor
    value_head: Tensor
    visible: Tensor
    alpha: Tensor
    values: Tensor | None  # the rows' values whole: only for the contribution ranking
    order: Tensor

    def slice(self, part: slice) -> "_SortedRows":
        return _SortedRows(*(None if t is None else t[part] for t in self))


class _Buffers:
    """The large per-chunk tensors, allocated once per context and reused by every chunk.

    Allocating them afresh for each chunk costs page faults and fragments the C
    heap, which then keeps hundreds of MiB no longer in use. Diagnostics get
    their own reused planes through `SelectionChunk.scratch`.
    """

    def __init__(
        self, rows: int, n_keys: int, d_head: int, n: int, n_segments: int, dtype: torch.dtype, device: torch.device
    ):
        self.rows, self.dtype, self.device = rows, dtype, device
        self.y_sorted = torch.empty((rows, n_keys, d_head), dtype=dtype, device=device)
        self.segments = torch.empty((rows, n_segments, d_head), dtype=dtype, device=device)
        self.s = torch.empty((rows, n, d_head), dtype=dtype, device=device)
        self.extra: dict[str, Tensor] = {}

    def scratch(self, name: str, rows: int, shape: tuple[int, ...], dtype: torch.dtype | None) -> Tensor:
        """An uninitialised ``[rows, *shape]`` buffer, the same memory for every chunk."""
        dtype = dtype or self.dtype
        buffer = self.extra.get(name)
        if buffer is None or buffer.shape[1:] != shape or buffer.dtype != dtype:
            buffer = self.extra[name] = torch.empty((self.rows, *shape), dtype=dtype, device=self.device)
        return buffer[:rows]


def rows_context(
    alpha: Float[Tensor, "row key"],
    values: Float[Tensor, "row key d_head"],
    visible: Bool[Tensor, "row key"],
    grid: Int[Tensor, " n"],
    *,
    ranking: Ranking,
    distance: Distance,
    memory_budget_mib: float,
    costs: Sequence[RowCost] = (),
    sink: Int[Tensor, " row"] | None = None,
) -> SelectionContext:
    """A context over independent rows (the engine's public functions): each row its own sequence.

    The sink is ``sink`` (a key index per row, -1 for none); by default key 0
    where it is visible, else none.
    """
    n_rows = alpha.shape[0]
    if sink is None:
        sink = torch.where(visible[:, 0], 0, -1)
    return SelectionContext(
        alpha[:, None, None, :],
        values[:, :, None, :],
        visible[:, None, :],
        sink[:, None],
        torch.ones(n_rows, 1, dtype=torch.bool, device=alpha.device),
        grid,
        ranking=ranking,
        distance=distance,
        memory_budget_mib=memory_budget_mib,
        costs=costs,
    )
