"""Top-N interventions: a ``hook_pattern`` function that keeps each row's N highest-ranked keys.

This is the one path in the package that changes the forward pass. For every
query row of the chosen heads, the hook ranks the keys the query can see
(causal, not padding, inside the layer's sliding window: see
`tl_geometry.capture.windows`), keeps the top N (ties: the earlier key, the
order of `tl_geometry.engine.context.selection_order`) and

- ``mode="delete"``: zeroes every other weight; the kept weights are unchanged,
  so the row sums to less than 1;
- ``mode="renormalise"``: zeroes every other weight and rescales the kept ones
  to sum to 1.

Rows whose query sees N keys or fewer are returned unchanged (bit for bit),
and so are the rows of padding queries and of heads not chosen. The ranking is
recomputed in every pass from the pattern the hook receives, so an
intervention at layer l changes what layer l + 1 ranks.

Rankings: ``"attention"`` (alpha_i), ``"contribution"`` (alpha_i ||v_i||, the
values taken from ``hook_v``, which fires before ``hook_pattern``), and
``"random"``: the random controls, a seeded random order of the visible keys
per row, the same for every N of one control (so the top-(N+1) set contains
the top-N set). Its scores are a hash of (seed, control, layer, row seed,
head, query, key), so a document's control does not depend on its batch.

Where a model computes attention inside a wrapped module and fires
``hook_pattern`` after the fact (some TransformerBridge adapters in
transformer-lens 4.x), an edited pattern never reaches the logits;
`check_pattern_edits` finds this once per model and layer and raises `GeometryError`.
"""

import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry._hashing import MASK32, hash32
from tl_geometry.capture.hook_names import pattern_hook, value_hook
from tl_geometry.capture.windows import attention_windows, visible_keys
from tl_geometry.config import resolve_indices
from tl_geometry.engine.context import selection_order
from tl_geometry.errors import GeometryError
from tl_geometry.interventions.control_cache import ControlRankCache

Mode = Literal["renormalise", "delete"]
InterventionRanking = Literal["attention", "contribution", "random"]


def _check_choice(name: str, value: Any, literal: Any) -> None:
    allowed = get_args(literal)
    if value not in allowed:
        raise GeometryError(f"{name}: expected one of {allowed}, got {value!r}")


def _check_n(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise GeometryError(f"n: expected a positive integer (the keys kept per row), got {n!r}")
    return n


def random_scores(
    shape: Sequence[int], *, seed: int, control: int, layer: int, row_seeds: Tensor | None = None,
    first_real: Tensor | None = None, device: Any = "cpu",
) -> Float[Tensor, "batch head_index query_pos key_pos"]:
    """Uniform scores in [0, 1) of one random control, a hash of (seed, control, layer, row seed, head, query, key).

    Each score depends only on those numbers, positions counted from the row's
    first real token, never on the batch's shape: the same document gets the
    same control in any batch, padded or not, and every N of a control ranks
    by the same order (nesting).

    Args:
        shape: ``[batch, head_index, query_pos, key_pos]``.
        row_seeds: one integer per row, e.g. a hash of the document's tokens (default 0 for every row).
        first_real: index of each row's first real token (default 0).

    >>> a = random_scores((1, 1, 3, 3), seed=0, control=1, layer=0)  # a longer row keeps the shorter one's scores
    >>> torch.equal(a[..., :2, :2], random_scores((1, 1, 2, 2), seed=0, control=1, layer=0))
    True
    """
    batch, heads, queries, keys = (int(i) for i in shape)
    rows = torch.zeros(batch, dtype=torch.long, device=device) if row_seeds is None else torch.as_tensor(row_seeds, device=device).long()
    first = torch.zeros(batch, dtype=torch.long, device=device) if first_real is None else first_real.to(device).long()
    h = hash32(torch.full((batch,), int(seed) & MASK32, dtype=torch.long, device=device))
    for part in (int(control), int(layer)):
        h = hash32(h ^ part)
    h = hash32(h ^ rows)[:, None, None, None]
    h = hash32(h ^ torch.arange(heads, device=device)[None, :, None, None])
    query = torch.arange(keys - queries, keys, device=device)[None, None, :, None] - first[:, None, None, None]
    h = hash32(h ^ (query & MASK32))
    key = torch.arange(keys, device=device)[None, None, None, :] - first[:, None, None, None]
    h = hash32(h ^ (key & MASK32))
    return h.double() / 2.0**32


def topn_ranks(scores: Float[Tensor, "*batch key"], visible: Bool[Tensor, "*batch key"]) -> Int[Tensor, "*batch key"]:
    """Each key's place in the row's top-N order (0: highest score; ties: the earlier key first); hidden keys last.

    The top-N set of a row is the keys whose place is below N (and visible).

    >>> topn_ranks(torch.tensor([[0.2, 0.5, 0.5, 0.9]]), torch.tensor([[True, True, True, False]])).tolist()
    [[2, 0, 1, 3]]
    """
    # The package's one top-N order: scores already hold the ranking's values, so rank them "by attention".
    rows, n_keys = scores.reshape(-1, scores.shape[-1]), scores.shape[-1]
    order = selection_order(rows, rows.new_ones((1, 1, 1)).expand(*rows.shape, 1), visible.reshape(-1, n_keys), "attention")
    places = torch.arange(n_keys, device=order.device, dtype=torch.int16 if n_keys < 2**15 else torch.int32)
    ranks = torch.empty_like(order, dtype=places.dtype).scatter_(-1, order, places.expand_as(order))
    return ranks.reshape(visible.shape)


def topn_keep(
    scores: Float[Tensor, "*batch key"], visible: Bool[Tensor, "*batch key"], n: int
) -> Bool[Tensor, "*batch key"]:
    """The N visible keys of highest score in each row (ties: the earlier key); hidden keys never kept.

    >>> topn_keep(torch.tensor([[0.2, 0.5, 0.5, 0.9]]), torch.tensor([[True, True, True, False]]), 2).tolist()
    [[False, True, True, False]]
    """
    return (topn_ranks(scores, visible) < n) & visible


def apply_topn(
    pattern: Float[Tensor, "batch head_index query_pos key_pos"],
    scores: Float[Tensor, "batch head_index query_pos key_pos"] | None,
    visible: Bool[Tensor, "batch query_pos key_pos"],
    n: int,
    mode: str,
    heads: Int[Tensor, " head"] | None = None,
    ranks: Int[Tensor, "batch head query_pos key_pos"] | None = None,
) -> Float[Tensor, "batch head_index query_pos key_pos"]:
    """The pattern with each row of ``heads`` cut to its top-N visible keys (a new tensor).

    The top N come from ``scores`` (of every head), or from ``ranks`` (`topn_ranks` of the chosen heads' scores,
    computed once for several N). Rows that see N keys or fewer, and heads not in ``heads``, are copied unchanged.
    """
    sub = pattern if heads is None else pattern[:, heads]
    seen = visible[:, None].expand(sub.shape)
    if ranks is None:
        assert scores is not None
        keep = topn_keep(scores if heads is None else scores[:, heads], seen, n)
    else:
        keep = (ranks < n) & seen
    edit = seen.sum(-1, keepdim=True) > n  # rows with more visible keys than N
    kept = sub.masked_fill(~keep, 0.0)
    if mode == "renormalise":
        kept = kept / kept.sum(-1, keepdim=True)
    new = torch.where(edit, kept, sub)
    if heads is None:
        return new
    out = pattern.clone()
    out[:, heads] = new
    return out


class TopNPatternHook:
    """A ``hook_pattern`` function (TransformerLens signature ``fn(pattern, *, hook)``) keeping the top-N keys.

    Made by `topn_pattern_hook`; see it for the arguments. With
    ``ranking="contribution"``, attach `value_hook` to the same layer's
    ``hook_v`` (`topn_hooks` does both).
    """

    def __init__(
        self,
        n: int,
        mode: str,
        ranking: str,
        heads: Sequence[int] | None,
        *,
        window: int | None,
        attention_mask: Tensor | None,
        control: int,
        seed: int,
        layer: int,
        row_seeds: Tensor | None = None,
        control_ranks: ControlRankCache | None = None,
    ) -> None:
        self.n = _check_n(n)
        _check_choice("mode", mode, Mode)
        _check_choice("ranking", ranking, InterventionRanking)
        self.mode, self.ranking = mode, ranking
        self.heads = None if heads is None else tuple(int(h) for h in heads)
        if self.heads is not None and (not self.heads or min(self.heads) < 0):
            raise GeometryError(f"heads: expected a non-empty list of head indices >= 0 or None (all), got {heads!r}")
        self.window, self.attention_mask = window, attention_mask
        self.control, self.seed, self.layer = int(control), int(seed), int(layer)
        self.row_seeds = row_seeds
        # A random control's order does not depend on N or the mode: hooks sharing this dict (a sweep's) rank once.
        self.control_ranks = control_ranks if ranking == "random" else None
        self._values: Tensor | None = None

    def value_hook(self, v: Float[Tensor, "batch pos kv_head d_head"], *, hook: Any = None) -> None:
        """Keep the layer's value states for the contribution ranking (read-only)."""
        self._values = v

    def visible(self, pattern: Tensor) -> Bool[Tensor, "batch query_pos key_pos"]:
        """Keys each query row sees: causal, real, inside the window; padding queries see none."""
        batch, _, n_query, n_key = pattern.shape
        if self.attention_mask is None:
            real = torch.ones(batch, n_key, dtype=torch.bool, device=pattern.device)
        else:
            real = self.attention_mask.to(pattern.device).bool()
            if real.shape != (batch, n_key):
                raise GeometryError(
                    f"attention_mask: expected [batch, key_pos] = {[batch, n_key]} like the pattern, got {list(real.shape)}"
                )
        query = torch.arange(n_key - n_query, n_key, device=pattern.device).expand(batch, n_query)
        return visible_keys(query, real, self.window) & real[:, n_key - n_query :, None]

    def scores(self, pattern: Tensor) -> Tensor:
        if self.ranking == "attention":
            return pattern
        if self.ranking == "random":
            first = None if self.attention_mask is None else self.attention_mask.to(pattern.device).int().argmax(-1)
            return random_scores(pattern.shape, seed=self.seed, control=self.control, layer=self.layer,
                                 row_seeds=self.row_seeds, first_real=first, device=pattern.device)
        values, self._values = self._values, None
        if values is None:
            raise GeometryError(
                f"topn_pattern_hook(ranking='contribution') on layer {self.layer}: no value states; attach "
                f"hook.value_hook to {value_hook(self.layer)} too (or build the hooks with topn_hooks)"
            )
        n_heads, n_kv = pattern.shape[1], values.shape[2]
        norms = torch.linalg.vector_norm(values[:, : pattern.shape[-1]].to(pattern.dtype), dim=-1)  # [batch, key, kv]
        norms = norms.repeat_interleave(n_heads // n_kv, dim=-1).transpose(1, 2)  # [batch, head, key]
        return pattern * norms[:, :, None, :]

    def __call__(self, pattern: Float[Tensor, "batch head_index query_pos key_pos"], *, hook: Any = None) -> Tensor:
        if pattern.ndim != 4:
            raise GeometryError(
                f"{pattern_hook(self.layer)}: expected [batch, head_index, query_pos, key_pos], got {list(pattern.shape)}"
            )
        heads = None
        if self.heads is not None:
            if max(self.heads) >= pattern.shape[1]:
                raise GeometryError(
                    f"heads: {list(self.heads)} out of range; the pattern has {pattern.shape[1]} heads"
                )
            heads = torch.tensor(self.heads, device=pattern.device)
        visible = self.visible(pattern)
        if self.control_ranks is None:
            return apply_topn(pattern, self.scores(pattern), visible, self.n, self.mode, heads)  # type: ignore[arg-type]
        key = (self.layer, self.control, self.heads, tuple(pattern.shape))
        ranks = self.control_ranks.get(key)
        if ranks is None:
            scores = self.scores(pattern)
            scores = scores if heads is None else scores[:, heads]
            ranks = topn_ranks(scores, visible[:, None].expand(scores.shape))  # on the layer's device
            self.control_ranks.keep(key, ranks)
        return apply_topn(pattern, None, visible, self.n, self.mode, heads, ranks=ranks)  # type: ignore[arg-type]


def topn_pattern_hook(
    # mode and ranking are annotated as what callers may pass; they are checked against Mode / InterventionRanking.
    n: int,
    mode: str = "renormalise",
    ranking: str = "attention",
    heads: Sequence[int] | None = None,
    *,
    window: int | None = None,
    attention_mask: Int[Tensor, "batch pos"] | Bool[Tensor, "batch pos"] | None = None,
    control: int = 0,
    seed: int = 0,
    layer: int = 0,
    row_seeds: Tensor | None = None,
    control_ranks: ControlRankCache | None = None,
) -> TopNPatternHook:
    """A ``hook_pattern`` function that keeps, in every row of ``heads``, the N highest-ranked visible keys.

    Args:
        n: keys kept per row (rows that see N keys or fewer are unchanged).
        mode: ``"renormalise"`` (kept weights rescaled to sum to 1) or
            ``"delete"`` (kept weights as they are).
        ranking: ``"attention"``, ``"contribution"`` (alpha_i ||v_i||; attach
            ``hook.value_hook`` to the layer's ``hook_v``) or ``"random"`` (a control).
        heads: query heads to edit (None: all).
        window: the layer's sliding window (None: global; see `tl_geometry.capture.windows.attention_windows`).
        attention_mask: 1 for real tokens when the batch is padded (padding keys are never kept).
        control: which random control (``ranking="random"``).
        seed: the random controls' seed.
        row_seeds: one integer per batch row for the random control (e.g. a
            hash of its document's tokens, as the sweep passes), so that a
            document's control does not depend on its batch; default 0.
        layer: the layer the hook is attached to (seeds the random control, names errors).
        control_ranks: for ``ranking="random"``, a `ControlRankCache` shared by
            the hooks of several N and modes of the same controls (as the sweep
            does): each control's order of a layer's rows is computed once and
            kept there, on the layer's device, while that device's budget
            allows (an int16 per pattern element; drop a control's orders when
            done with it).

    Returns:
        A callable ``fn(pattern, *, hook)`` for ``model.hooks(fwd_hooks=[(name, fn)])`` or ``run_with_hooks``.

    Example:
        >>> hook = topn_pattern_hook(1, mode="delete")
        >>> hook(torch.tensor([[[[1.0, 0.0], [0.25, 0.75]]]])).tolist()
        [[[[1.0, 0.0], [0.0, 0.75]]]]
    """
    return TopNPatternHook(n, mode, ranking, heads, window=window, attention_mask=attention_mask,
                           control=control, seed=seed, layer=layer, row_seeds=row_seeds, control_ranks=control_ranks)


def topn_hooks(
    model: Any,
    n: int,
    *,
    layers: Sequence[int] | None = None,
    mode: str = "renormalise",
    ranking: str = "attention",
    heads: Sequence[int] | None = None,
    attention_mask: Tensor | None = None,
    control: int = 0,
    seed: int = 0,
    check: bool = True,
) -> list[tuple[str, Callable[..., Any]]]:
    """The ``fwd_hooks`` of a top-N intervention on ``layers`` (default: all) of a model.

    Each layer gets its own sliding window (`tl_geometry.capture.windows.attention_windows`);
    the contribution ranking also gets its ``hook_v``. With ``check=True`` the
    model is first checked (once per layer) to really use edited patterns (`check_pattern_edits`).

    >>> with model.hooks(fwd_hooks=topn_hooks(model, 8, mode="delete")):  # doctest: +SKIP
    ...     logits = model(tokens)
    """
    n_layers = int(model.cfg.n_layers)
    # Negative layers count from the end, as in TransformerLens (-1: the last).
    chosen = resolve_indices("layers", None if layers is None else [int(layer) for layer in layers], n_layers,
                             "n_layers")
    if check:
        check_pattern_edits(model, chosen)
    windows = attention_windows(model)
    out: list[tuple[str, Callable[..., Any]]] = []
    for layer in chosen:
        hook = topn_pattern_hook(n, mode, ranking, heads, window=windows[layer], attention_mask=attention_mask,
                                 control=control, seed=seed, layer=layer)
        if ranking == "contribution":
            out.append((value_hook(layer), hook.value_hook))
        out.append((pattern_hook(layer), hook))
    return out


_CHECKED: "weakref.WeakKeyDictionary[Any, set[int]]" = weakref.WeakKeyDictionary()


def _model_label(model: Any) -> str:
    return f"{type(model).__name__} {getattr(model.cfg, 'model_name', '')!r}".strip()


def check_pattern_edits(model: Any, layers: Sequence[int] | None = None) -> None:
    """Raise unless editing ``hook_pattern`` changes the logits on ``layers`` (default: every layer).

    One short forward pass per layer not checked before on this model: that
    layer's pattern is replaced by attention to each query's own position
    only, and the logits must differ from the clean ones.

    Raises:
        GeometryError: naming the model and the layers whose edits are discarded, and what to do.
    """
    checked = _CHECKED.setdefault(model, set())
    wanted = range(int(model.cfg.n_layers)) if layers is None else layers
    unchecked = sorted(set(int(layer) for layer in wanted) - checked)
    if not unchecked:
        return
    device = getattr(model.cfg, "device", None)
    tokens = torch.tensor([[0, 1, 2, 3]]) if device is None else torch.tensor([[0, 1, 2, 3]], device=device)
    tokens = tokens % int(model.cfg.d_vocab)

    def own_position(pattern: Tensor, *, hook: Any = None) -> Tensor:
        eye = torch.eye(pattern.shape[-1], dtype=pattern.dtype, device=pattern.device)
        return eye[-pattern.shape[-2]:].expand(pattern.shape).clone()

    with torch.inference_mode():
        clean = model(tokens)
        ignored = []
        for layer in unchecked:
            with model.hooks(fwd_hooks=[(pattern_hook(layer), own_position)]), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TransformerLens warns about discarded edits; we raise below
                edited = model(tokens)
            if torch.equal(edited, clean):
                ignored.append(layer)
    if ignored:
        raise GeometryError(
            f"model {_model_label(model)}: editing {pattern_hook(ignored[0])} does not change the logits on layers "
            f"{ignored}; its attention runs inside the wrapped Hugging Face module and fires hook_pattern after the "
            "fact, so top-N interventions would measure nothing. Load it with load_model(..., compatibility_mode="
            "True) or boot the TransformerBridge with eager attention (attn_implementation='eager'), or use a "
            "HookedTransformer (transformer-lens 3.x)"
        )
    checked.update(unchecked)
