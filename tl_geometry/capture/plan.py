"""What a run analyses, worked out once from the model and the config.

`plan_run` checks the layers and heads against the model and its hook points,
finds the value head each analysed query head reads (grouped-query
attention), every layer's sliding window, the active diagnostics (each
checked against the config), with those that read a query sample, and the
capture path (``capture="auto"`` resolved for this model). The
accumulator, the grid and the hooks of every batch read the plan; nothing
recomputes it per batch.
"""

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from jaxtyping import Int
from torch import Tensor

from tl_geometry.capture.hook_names import pattern_hook, value_hook
from tl_geometry.capture.rows import why_not_rows
from tl_geometry.capture.tokens import HookableModel
from tl_geometry.capture.windows import attention_windows
from tl_geometry.config import GeometryConfig, resolve_indices
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.registry import REGISTRY, Diagnostic
from tl_geometry.errors import GeometryError


@dataclass(frozen=True)
class RunPlan:
    """The analysed layers and heads of one model under one config, and what runs on them.

    Attributes:
        config: the run's config, its ``capture`` the path this run takes ("rows" or "pattern").
        layers, heads: the analysed layer and head numbers.
        n_heads, n_kv: the model's query and KV heads per layer.
        kv_heads: the KV head each analysed query head reads, ``[head_index]``.
        windows: every layer's sliding window (None: global attention).
        diagnostics: the active diagnostics, checked against the config.
        sampled: those whose settings ask for a query sample (the taxonomy's).
    """

    config: GeometryConfig
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    n_heads: int
    n_kv: int
    kv_heads: Int[Tensor, " head_index"]
    windows: tuple[int | None, ...]
    diagnostics: tuple[Diagnostic, ...]
    sampled: tuple[Diagnostic, ...]

    def fields(self) -> dict[str, FieldSpec]:
        """Every field the active diagnostics declare, by name."""
        return REGISTRY.fields_of(self.diagnostics)


def plan_run(model: HookableModel, config: GeometryConfig) -> RunPlan:
    """The plan of a run of ``config`` on ``model``; GeometryError naming a layer, head or hook it cannot have."""
    layers, heads, n_heads, n_kv = _model_shape(model, config)
    diagnostics = active_diagnostics(config)
    # The config recorded holds the indices resolved (-1 -> the last layer), so results of [-1] and [29] merge.
    resolved = {"layers": None if config.layers is None else layers, "heads": None if config.heads is None else heads}
    return RunPlan(
        config=replace(config, capture=capture_path(model, config.capture), **resolved),
        layers=layers,
        heads=heads,
        n_heads=n_heads,
        n_kv=n_kv,
        kv_heads=kv_head_of(torch.tensor(heads, dtype=torch.long), n_heads, n_kv),
        windows=tuple(attention_windows(model)),
        diagnostics=diagnostics,
        sampled=tuple(d for d in diagnostics if getattr(config.settings_for(d.name), "queries", None) == "sample"),
    )


_SAID: set[str] = set()  # the reasons capture="auto" fell back for, said once each per process


def capture_path(model: HookableModel, capture: str) -> str:
    """The capture path a run takes: ``capture`` itself, or for ``"auto"`` the rows where the model can take
    them (`tl_geometry.capture.rows.why_not_rows`), else the pattern, with a warning the first time."""
    if capture != "auto":
        return capture
    reason = why_not_rows(model)
    if reason is None:
        return "rows"
    if reason not in _SAID:
        _SAID.add(reason)
        warnings.warn(f'capture="auto": the pattern path (eager attention), since {reason}; pass capture="pattern" '
                      "to choose it and silence this", stacklevel=3)
    return "pattern"


def kv_head_of(heads: Int[Tensor, " head_index"], n_heads: int, n_kv_heads: int) -> Int[Tensor, " head_index"]:
    """The KV head each query head reads under grouped-query attention: h // (n_heads / n_kv_heads).

    >>> kv_head_of(torch.arange(4), 4, 2).tolist()
    [0, 0, 1, 1]
    """
    return heads // (n_heads // n_kv_heads)


def _model_shape(model: HookableModel, config: GeometryConfig) -> tuple[tuple[int, ...], tuple[int, ...], int, int]:
    """Layers and heads to analyse (checked against the model and its hook points), and its query and KV head counts."""
    cfg = model.cfg
    n_heads = int(cfg.n_heads)
    n_kv = int(getattr(cfg, "n_key_value_heads", None) or n_heads)
    if n_heads % n_kv:
        raise GeometryError(f"model: n_heads = {n_heads} is not a multiple of n_key_value_heads = {n_kv}")
    layers = resolve_indices("layers", config.layers, int(cfg.n_layers), "n_layers")
    heads = resolve_indices("heads", config.heads, n_heads, "n_heads")
    _check_picture_heads(config.picture_heads, layers, heads, int(cfg.n_layers), n_heads)
    hook_dict = model.hook_dict
    for layer in layers:
        for name in (value_hook(layer), pattern_hook(layer)):
            if name not in hook_dict:
                raise GeometryError(
                    f"model: no hook point {name!r}; tl_geometry reads the value states and attention "
                    "pattern of each layer. On a TransformerBridge call model.enable_compatibility_mode() "
                    "or boot it with eager attention; for other models, analyse only layers that expose "
                    "these hooks (see model.hook_dict)"
                )
    return layers, heads, n_heads, n_kv


def _check_picture_heads(
    pairs: Sequence[tuple[int, int]], layers: tuple[int, ...], heads: tuple[int, ...], n_layers: int, n_heads: int
) -> None:
    """GeometryError unless every ``(layer, head)`` of ``picture_heads`` exists and is analysed."""
    for layer, head in pairs:
        if layer >= n_layers or head >= n_heads:
            raise GeometryError(
                f"picture_heads: ({layer}, {head}) is not a head of this model, which has {n_layers} layers "
                f"(cfg.n_layers) and {n_heads} heads per layer (cfg.n_heads); use layers 0..{n_layers - 1} and heads "
                f"0..{n_heads - 1}"
            )
        if layer not in layers or head not in heads:
            raise GeometryError(
                f"picture_heads: ({layer}, {head}) is not analysed by this run (layers {list(layers)}, heads "
                f"{list(heads)}); add layer {layer} and head {head} to layers / heads, or drop the picture"
            )


def active_diagnostics(config: GeometryConfig) -> tuple[Diagnostic, ...]:
    """The always-on diagnostics and those the config asks for, each checked against the config."""
    diagnostics = REGISTRY.active(config.diagnostics)
    for diagnostic in diagnostics:
        diagnostic.check(config)
    return diagnostics
