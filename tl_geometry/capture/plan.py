"""What a run analyses, worked out once from the model, the config and the inputs' length.

`plan_run` checks the layers and heads against the model and its hook points,
finds the value head each analysed query head reads (grouped-query
attention), every layer's sliding window, the active diagnostics (the config
checked them when it was made) with each one's settings, those that read a
query sample, the fields that keep replicates, and the capture path
(``capture="auto"`` resolved for this model: the config keeps what was asked,
the plan records the path taken, and why where auto fell back to the pattern).
`RunPlan.with_grid` decides the N grid, the one place that does, once the most
keys a query sees is known. The accumulator and the hooks of every batch read
the plan; nothing is looked up again per batch or per hook call, and nothing
of a run is kept in a module global.
"""

import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from tl_geometry.capture.hook_names import pattern_hook, value_hook
from tl_geometry.capture.rows import why_not_rows
from tl_geometry.capture.tokens import HookableModel, PreparedTokens
from tl_geometry.capture.windows import attention_windows
from tl_geometry.config import GeometryConfig, resolve_indices
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.registry import REGISTRY, Diagnostic
from tl_geometry.engine.grid import grid_of
from tl_geometry.errors import GeometryError
from tl_geometry.results.accumulators import Accumulator


@dataclass(frozen=True)
class RunPlan:
    """The analysed layers and heads of one model under one config, what runs on them and how.

    Attributes:
        config: the run's config as asked (``capture="auto"`` stays ``"auto"``), its layer and head
            indices resolved (-1 -> the last layer).
        layers, heads: the analysed layer and head numbers.
        n_heads, n_kv: the model's query and KV heads per layer.
        kv_heads: the KV head each analysed query head reads, ``[head_index]``.
        windows: every layer's sliding window (None: global attention).
        diagnostics: the active diagnostics.
        settings: each active diagnostic's settings, by name.
        sampled: those whose settings ask for a query sample (the roles diagnostic's).
        replicate_fields: the fields that keep bootstrap replicates.
        resampled: those of them that also resample the query rows.
        capture: the path this run takes, ``"rows"`` or ``"pattern"``.
        capture_reason: why ``capture="auto"`` took the pattern (None: it was asked, or auto took the rows).
        grid: the N grid (`with_grid`; None until the inputs' length is known).
    """

    config: GeometryConfig
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    n_heads: int
    n_kv: int
    kv_heads: Int[Tensor, " head_index"]
    windows: tuple[int | None, ...]
    diagnostics: tuple[Diagnostic, ...]
    settings: Mapping[str, Any]
    sampled: tuple[Diagnostic, ...]
    replicate_fields: frozenset[str]
    resampled: frozenset[str]
    capture: str
    capture_reason: str | None = None
    grid: Int[Tensor, " n"] | None = None

    def fields(self) -> dict[str, FieldSpec]:
        """Every field the active diagnostics declare, by name."""
        return REGISTRY.fields_of(self.diagnostics)

    def visible_keys(self, prepared: Sequence[PreparedTokens]) -> int:
        """The most keys any analysed query of these batches sees in an analysed layer (0 without batches)."""
        used = [self.windows[layer] for layer in self.layers]
        return max((batch.max_visible(used) for batch in prepared), default=0)

    def with_grid(self, n_keys: int) -> "RunPlan":
        """The plan with its N grid: the config's, the default's last N ``n_keys`` (the most keys a query sees)."""
        return replace(self, grid=grid_of(self.config.n_grid, n_keys))  # type: ignore[arg-type]

    def provenance(self) -> dict[str, Any]:
        """What the result records of how the run went: the capture path taken (and why, where auto fell back)."""
        return {"capture": self.capture} | ({} if self.capture_reason is None else {"capture_reason": self.capture_reason})

    def new_accumulator(self) -> Accumulator:
        """An empty accumulator for the fields of the plan's diagnostics, over the plan's grid."""
        if self.grid is None:
            raise GeometryError("run plan: no N grid yet; call plan.with_grid(n_keys) once the inputs are known")
        return Accumulator(
            list(self.fields().values()),
            layers=self.layers,
            heads=self.heads,
            n_grid=self.grid,
            n_bootstrap=self.config.n_bootstrap,
            replicate_fields=self.replicate_fields,
            keep_queries=self.config.keep_queries,
            picture_heads=self.config.picture_heads,
            document_rows=True,  # a run of few documents keeps their values: smaller than the sums (results/stats.py)
        )


def plan_run(model: HookableModel, config: GeometryConfig, prepared: Sequence[PreparedTokens] | None = None) -> RunPlan:
    """The plan of a run of ``config`` on ``model``; GeometryError naming a layer, head or hook it cannot have.

    With ``prepared`` (the run's batches) the plan has its N grid; without, `RunPlan.with_grid` gives it
    once the inputs' length is known (a corpus read lazily, ranks that agree on it first). Where
    ``capture="auto"`` takes the pattern, a warning says why, once per plan, so once per run.
    """
    layers, heads, n_heads, n_kv = _model_shape(model, config)
    diagnostics = REGISTRY.active(config.diagnostics)  # checked against the config when it was made
    settings = {d.name: config.settings_for(d.name) for d in diagnostics}
    specs = REGISTRY.fields_of(diagnostics)
    chosen = config.resolve_bootstrap_fields(specs)  # checked even without replicates
    replicate_fields = chosen if config.n_bootstrap else frozenset()  # as the accumulator keeps them
    capture, reason = capture_path(model, config.capture)
    if reason is not None:
        # Said at the line that started the run, where Python's warnings registry shows each reason once per
        # calling line (unless the user's filter asks for more): no record of ours outlives the run.
        warnings.warn(f'capture="auto": the pattern path (eager attention), since {reason}; pass capture="pattern" '
                      "to choose it and silence this", stacklevel=_callers_level(sys._getframe()))
    # The config recorded holds the indices resolved (-1 -> the last layer), so results of [-1] and [29] merge.
    resolved = {"layers": None if config.layers is None else layers, "heads": None if config.heads is None else heads}
    if (config.layers, config.heads) != (resolved["layers"], resolved["heads"]):
        config = replace(config, **resolved)
    plan = RunPlan(
        config=config,
        layers=layers,
        heads=heads,
        n_heads=n_heads,
        n_kv=n_kv,
        kv_heads=kv_head_of(torch.tensor(heads, dtype=torch.long), n_heads, n_kv),
        windows=tuple(attention_windows(model)),
        diagnostics=diagnostics,
        settings=MappingProxyType(settings),
        sampled=tuple(d for d in diagnostics if getattr(settings[d.name], "queries", None) == "sample"),
        replicate_fields=replicate_fields,
        resampled=frozenset(
            spec.name for spec in specs.values() if spec.resample_queries and spec.name in replicate_fields
        ),
        capture=capture,
        capture_reason=reason,
    )
    return plan if prepared is None else plan.with_grid(plan.visible_keys(prepared))


# Frames of the package and of the runtime type checkers that may wrap its functions (jaxtyping, beartype).
_OWN_FRAMES = ("tl_geometry", "jaxtyping", "beartype", "typeguard")


def _callers_level(frame: Any) -> int:
    """The ``stacklevel`` that makes a warning given in ``frame`` point at the first frame outside the package:
    the user's line that started the run, however deep the package called."""
    level = 1
    while frame is not None and str(frame.f_globals.get("__name__", "")).split(".")[0] in _OWN_FRAMES:
        frame, level = frame.f_back, level + 1
    return level


def capture_path(model: HookableModel, capture: str) -> tuple[str, str | None]:
    """The capture path a run of ``capture`` takes on ``model``, and why ``"auto"`` took the pattern (else None).

    ``"auto"`` takes the rows where the model can take them (`tl_geometry.capture.rows.why_not_rows`), else
    the pattern; ``"rows"`` and ``"pattern"`` are taken as asked.
    """
    if capture != "auto":
        return capture, None
    reason = why_not_rows(model)
    return ("rows", None) if reason is None else ("pattern", reason)


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
