"""Two published per-head measures, computed from their definitions, to set beside the roles.

- **First-token sink rate** (Gu et al., "When Attention Sink Emerges in
  Language Models: An Empirical View", ICLR 2025). The importance score of
  the first token in head h of layer l is the mean attention weight on it
  over the queries (all of them see it): alpha = (1/T) sum_t A[t, 0]. A
  (sequence, layer, head) counts when alpha > epsilon; the sink rate is the
  share of such triples. Their epsilon is 0.3 and their sequences are 64
  tokens long (our defaults; both are parameters). A head is a *sink head*
  here when its score averaged over the sequences exceeds epsilon.
- **Dormant heads by output norm** (Sandoval-Segura et al., "Using
  Attention Sinks to Identify and Evaluate Dormant Heads in Pretrained LLMs",
  ICLR 2026): a head is dormant when its average output norm is below a
  fraction of the average head output norm of its layer. The material we
  could read states the rule but not the fraction they use, so it is a
  parameter, ``dormant_threshold`` (default 0.2, our choice). The norm is
  the head's output before W_O (``space="z"``, ``hook_z``) or its
  contribution to the residual stream (``space="result"``, z times the
  head's W_O), averaged over every position of every sequence.

Both come from one forward pass per batch, through ``hook_pattern`` and
``hook_z`` (read-only hooks; the model is left as it was).
"""

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from tl_geometry.analysis.role_ablation import PublishedMeasures
from tl_geometry.capture.held_models import as_hookable
from tl_geometry.capture.hook_names import pattern_hook, z_hook
from tl_geometry.capture.tokens import check_model, input_device
from tl_geometry.corpus_input.plain_text import default_text
from tl_geometry.corpus_input.token_windows import text_windows
from tl_geometry.engine.context import working_dtype
from tl_geometry.errors import GeometryError

GU_EPSILON = 0.3
"""Gu et al.'s threshold on the first token's importance score."""
GU_LENGTH = 64
"""Gu et al.'s sequence length (tokens)."""
DORMANT_THRESHOLD = 0.2
"""Our default fraction of the layer's average head output norm below which a head is dormant (not theirs)."""
SPACES = ("z", "result")


def published_measures(
    model: Any,
    tokens: Int[Tensor, "sequence pos"] | None = None,
    *,
    n_sequences: int = 32,
    length: int = GU_LENGTH,
    epsilon: float = GU_EPSILON,
    dormant_threshold: float = DORMANT_THRESHOLD,
    space: str = "z",
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    batch_size: int = 8,
    progress: bool = True,
    tokenizer: Any = None,
) -> PublishedMeasures:
    """Gu et al.'s first-token sink scores and rate, and each head's output norm against its layer's.

    Args:
        model: a TransformerLens model, a ``transformers`` causal LM or an nnsight ``LanguageModel`` (wrapped
            once, `tl_geometry.capture.held_models`); left as it was.
        tokens: sequences ``[sequence, pos]``, BOS first; default: ``n_sequences`` windows of ``length``
            tokens of the default text.
        epsilon: the sink threshold (Gu et al.: 0.3).
        dormant_threshold: a head is dormant when its average output norm is below this fraction of its
            layer's average head output norm.
        space: ``"z"`` (output before W_O) or ``"result"`` (after W_O).
        layers: the layers reported (default all).
        heads: the heads reported (default all); a layer's average is over all its heads.
        batch_size: sequences per forward pass.
        progress: a progress bar over the batches.
        tokenizer: for a ``transformers`` or nnsight model, its tokenizer (as in `tl_geometry.run_with_geometry_hooks`).
    """
    model = as_hookable(model, tokenizer, compatibility_mode=True)
    check_model(model)
    if not 0 < float(epsilon) < 1:
        raise GeometryError(f"epsilon: expected a threshold in (0, 1) on the mean first-token weight, got {epsilon!r}")
    if not float(dormant_threshold) > 0:
        raise GeometryError(f"dormant_threshold: expected a fraction > 0 of the layer's mean norm, got {dormant_threshold!r}")
    if space not in SPACES:
        raise GeometryError(f"space: expected one of {SPACES}, got {space!r}")
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    layers = tuple(range(n_layers)) if layers is None else tuple(int(layer) for layer in layers)
    heads = tuple(range(n_heads)) if heads is None else tuple(int(head) for head in heads)
    if any(not 0 <= layer < n_layers for layer in layers) or any(not 0 <= head < n_heads for head in heads):
        raise GeometryError(f"layers/heads: {list(layers)} / {list(heads)} out of range; the model has {n_layers} "
                            f"layers x {n_heads} heads")
    if tokens is None:
        tokens = text_windows(model, default_text(), context=length, n_windows=n_sequences)
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.is_floating_point() or tokens.shape[1] < 2:
        raise GeometryError(f"tokens: expected integer token ids [sequence, pos] with pos >= 2, got "
                            f"{type(tokens).__name__} {list(getattr(tokens, 'shape', []))}")
    device = input_device(model)
    scores: list[list[Tensor]] = [[] for _ in range(n_layers)]  # per layer: [sequence, head] chunks
    norm_sum: list[Tensor | None] = [None] * n_layers
    positions = 0

    def on_pattern(pattern: Tensor, *, hook: Any, layer: int) -> None:
        scores[layer].append(pattern[..., :, 0].to(working_dtype(pattern)).mean(-1))  # [batch, head]

    def on_z(z: Tensor, *, hook: Any, layer: int) -> None:
        z = z.to(working_dtype(z))
        if space == "result":
            w_o = model.blocks[layer].attn.W_O.to(device=z.device, dtype=z.dtype)  # [head, d_head, d_model]
            z = torch.einsum("bphd,hdm->bphm", z, w_o)
        part = torch.linalg.vector_norm(z, dim=-1).sum((0, 1))  # [head]
        norm_sum[layer] = part if norm_sum[layer] is None else norm_sum[layer] + part

    hooks = []
    for layer in range(n_layers):
        hooks.append((pattern_hook(layer), lambda t, hook, layer=layer: on_pattern(t, hook=hook, layer=layer)))
        hooks.append((z_hook(layer), lambda t, hook, layer=layer: on_z(t, hook=hook, layer=layer)))
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        for start in tqdm(range(0, tokens.shape[0], batch_size), desc="tl_geometry: sink and norm", disable=not progress):
            batch = tokens[start : start + batch_size].to(device)
            model(batch, return_type=None)
            positions += batch.numel()
    # Each layer's sums gathered from wherever its block ran (a device map splits the model).
    per_sequence = torch.stack([torch.cat(s).cpu() for s in scores], dim=1)  # [sequence, layer, head]
    norms = torch.stack([n.cpu() for n in norm_sum]) / positions  # type: ignore[union-attr]  # [layer, head]
    ratio = norms / norms.mean(-1, keepdim=True)
    li, hi = torch.tensor(layers, device=norms.device), torch.tensor(heads, device=norms.device)
    pick = lambda t: t.index_select(-2, li).index_select(-1, hi).double().cpu()  # noqa: E731
    above = per_sequence > epsilon
    return PublishedMeasures(
        layers=layers, heads=heads,
        first_token_score=pick(per_sequence.mean(0)), sink_indicator_rate=pick(above.double().mean(0)),
        sink_rate=float(pick(above.double()).mean()), epsilon=float(epsilon),
        output_norm=pick(norms), norm_ratio=pick(ratio), dormant_threshold=float(dormant_threshold), space=space,
        sequences=int(tokens.shape[0]), length=int(tokens.shape[1]),
    )
