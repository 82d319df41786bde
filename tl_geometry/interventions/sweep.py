"""intervention_sweep: the change in next-token NLL when attention keeps only its top-N keys.

For every batch of windows: one clean pass (shared by every setting), then
one intervened pass per (scope unit, mode, N, control), each reduced at once
to a per-document mean NLL. Each batch becomes a per-document table that an
`Accumulator` adds (`sweep_batch`), so a corpus is "accumulate per window,
merge": shards of a corpus give accumulators that merge exactly, whatever
runs them.

For ``scope="layer"`` and ``"head"`` the intervened passes can start from the
clean residual stream entering the intervened layer (``start_at_layer``)
instead of the embeddings (``reuse_residual=True``, where the model's forward
takes ``start_at_layer``): layers below it are untouched by the intervention,
so their output is the clean one. TransformerBridge supports it from
transformer-lens 4 (3.9's raises NotImplementedError, so reuse is off there),
but its ``start_at_layer`` still runs every block and discards the output of
those below the start; `blocks_below_skipped` makes those blocks pass their
input through for the duration of the pass, so the reuse saves their compute
there too. benchmarks/bench_interventions.py measures what it saves.
"""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, get_args

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from tl_geometry.analysis.sweep_statistics import (
    DEFAULT_TAUS,
    EffectiveSetSize,
    n_star_needs,
    n_star_of,
    stack_n_star,
)
from tl_geometry.capture.held_models import as_hookable
from tl_geometry.capture.hook_names import pattern_hook, value_hook
from tl_geometry.capture.hooks import model_name
from tl_geometry.runs import distributed
from tl_geometry.runs.corpus_run import prepared_batches
from tl_geometry.interventions.control_cache import ControlRankCache
from tl_geometry.interventions.topn_attention import (
    Mode,
    check_pattern_edits,
    topn_pattern_hook,
)
from tl_geometry.capture.tokens import HookableModel, PreparedTokens, accepts_attention_mask
from tl_geometry.capture.windows import attention_windows
from tl_geometry.config import DEFAULT_BOOTSTRAP, GeometryConfig, resolve_indices
from tl_geometry.results.display import head_name
from tl_geometry.engine.context import working_dtype
from tl_geometry.engine.inputs import check_mib
from tl_geometry.errors import GeometryError
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.bootstrap import document_weights
from tl_geometry.results.intervention_result import (
    ALL,
    CLEAN_FIELD,
    InterventionResult,
    control_mean_spec,
    control_spec,
    dnll_spec,
    sweep_specs,
)
from tl_geometry.results.provenance import STAMPED, package_versions

Scope = Literal["model", "layer", "head"]
DEFAULT_CONTROLS = 16
# The N a sweep tries where none are asked for (the command's --n-grid default): powers of two, each one
# forward pass per setting.
DEFAULT_SWEEP_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def resid_hook(layer: int) -> str:
    """Name of the residual stream entering a block, ``[batch, pos, d_model]``."""
    return f"blocks.{layer}.hook_resid_pre"


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep measures: the units, modes, N grid, controls, and how each pass runs."""

    scope: str
    layers: tuple[int, ...]  # intervened layers
    heads: tuple[int, ...] | None  # intervened heads (None: all)
    n_heads: int
    n_grid: tuple[int, ...]
    modes: tuple[str, ...]
    ranking: str
    n_controls: int
    seed: int
    n_bootstrap: int
    reuse_residual: bool
    windows: tuple[int | None, ...]
    settings_per_pass: int = 1  # (mode, N, control) settings stacked along the batch of one forward pass
    control_cache_mib: float = 1024.0  # memory per device for keeping a random control's order across its N and modes

    @property
    def unit_layers(self) -> tuple[int, ...]:
        return (ALL,) if self.scope == "model" else self.layers

    @property
    def unit_heads(self) -> tuple[int, ...]:
        if self.scope != "head":
            return (ALL,)
        return self.heads if self.heads is not None else tuple(range(self.n_heads))

    def units(self) -> list[tuple[int, int, tuple[int, ...], tuple[int, ...] | None]]:
        """(layer index on the axis, head index on the axis, layers to cut, heads to cut) of every unit."""
        out = []
        for i, layer in enumerate(self.unit_layers):
            for j, head in enumerate(self.unit_heads):
                cut_layers = self.layers if layer == ALL else (layer,)
                cut_heads = self.heads if head == ALL else (head,)
                out.append((i, j, cut_layers, cut_heads))
        return out

    @property
    def passes_per_batch(self) -> int:
        return len(self.unit_layers) * len(self.unit_heads) * len(self.modes) * len(self.n_grid) * (1 + self.n_controls)


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise GeometryError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return value


def make_plan(
    model: HookableModel,
    n_grid: Sequence[int],
    *,
    modes: Sequence[str],
    scope: str,
    layers: Sequence[int] | None,
    heads: Sequence[int] | None,
    ranking: str,
    controls: int,
    seed: int,
    n_bootstrap: int,
    reuse_residual: bool | None,
    settings_per_pass: int = 1,
    control_cache_mib: int | float = 1024,
) -> SweepPlan:
    """Check a sweep's arguments against the model and fix what it will run."""
    if scope not in get_args(Scope):
        raise GeometryError(f"scope: expected one of {get_args(Scope)}, got {scope!r}")
    if isinstance(modes, str):
        modes = (modes,)
    for mode in modes:
        if mode not in get_args(Mode):
            raise GeometryError(f"modes: {mode!r} is not one of {get_args(Mode)}")
    if not modes or len(set(modes)) != len(modes):
        raise GeometryError(f"modes: expected distinct modes from {get_args(Mode)}, got {list(modes)}")
    if ranking not in ("attention", "contribution"):
        raise GeometryError(f"ranking: expected 'attention' or 'contribution', got {ranking!r}")
    grid = [int(n) for n in n_grid] if not isinstance(n_grid, Tensor) else n_grid.tolist()
    if not grid or any(n < 1 for n in grid) or grid != sorted(set(grid)):
        raise GeometryError(f"n_grid: expected increasing distinct integers >= 1, e.g. [1, 2, 4, 8], got {grid}")
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    if layers is not None and not len(layers):
        raise GeometryError(f"layers: expected layer indices in 0..{n_layers - 1} (cfg.n_layers = {n_layers}), got {layers!r}")
    if heads is not None and not len(heads):
        raise GeometryError(f"heads: expected head indices in 0..{n_heads - 1} (cfg.n_heads = {n_heads}), got {heads!r}")
    # Negative indices count from the end, as in TransformerLens (-1: the last layer or head).
    chosen = resolve_indices("layers", None if layers is None else [int(i) for i in layers], n_layers, "n_layers")
    chosen_heads = None if heads is None else resolve_indices("heads", [int(h) for h in heads], n_heads, "n_heads")
    for layer in chosen:
        if pattern_hook(layer) not in model.hook_dict:
            raise GeometryError(f"model: no hook point {pattern_hook(layer)!r}; interventions edit each layer's pattern")
    supports = supports_start_at_layer(model)
    if reuse_residual is None:
        reuse_residual = supports and scope != "model"
    if reuse_residual and not supports:
        raise GeometryError(
            f"reuse_residual: {type(model).__name__} cannot start a forward pass at a layer (start_at_layer) with this "
            "transformer-lens; pass reuse_residual=False"
        )
    return SweepPlan(
        scope=scope, layers=chosen, heads=chosen_heads, n_heads=n_heads, n_grid=tuple(grid), modes=tuple(modes),
        ranking=ranking, n_controls=_check_int("controls", controls, 0), seed=int(seed),
        n_bootstrap=_check_int("n_bootstrap", n_bootstrap, 0), reuse_residual=bool(reuse_residual and scope != "model"),
        windows=attention_windows(model), settings_per_pass=_check_int("settings_per_pass", settings_per_pass, 1),
        control_cache_mib=check_mib(control_cache_mib, "control_cache_mib", zero=True),
    )


def supports_start_at_layer(model: Any) -> bool:
    """Whether ``model(residual, start_at_layer=l)`` works: HookedTransformer, and TransformerBridge from
    transformer-lens 4 (3.9's bridge takes the argument but raises NotImplementedError)."""
    import inspect

    from tl_geometry.models import transformer_lens_major_version

    if "start_at_layer" not in inspect.signature(model.forward).parameters:
        return False
    is_bridge = any(cls.__name__ == "TransformerBridge" for cls in type(model).__mro__)
    return not is_bridge or transformer_lens_major_version() >= 4


def _passes_input_through(*args: Any, **kwargs: Any) -> Any:
    return args[0] if args else kwargs["hidden_states"]


@contextmanager
def blocks_below_skipped(model: Any, start: int) -> Iterator[None]:
    """Blocks ``0..start-1`` of a TransformerBridge return their input unchanged while the context is open.

    The bridge's ``start_at_layer`` runs the wrapped model's whole forward and swaps the caller's residual in at
    block ``start``, so whatever the blocks below compute is thrown away; skipping them gives the same logits
    for a fraction of the work. The wrapped layers get an instance-level ``forward`` that is removed (or the one
    they had put back) on exit, whatever happens. HookedTransformer skips those blocks itself: nothing to do.
    """
    is_bridge = any(cls.__name__ == "TransformerBridge" for cls in type(model).__mro__)
    if not is_bridge or start <= 0:
        yield
        return
    missing = object()
    patched: list[tuple[torch.nn.Module, Any]] = []
    try:
        for block in list(model.blocks)[:start]:
            layer = block.original_component
            patched.append((layer, layer.__dict__.get("forward", missing)))
            layer.forward = _passes_input_through
        yield
    finally:
        for layer, saved in reversed(patched):
            if saved is missing:
                del layer.forward
            else:
                layer.forward = saved


def new_sweep_accumulator(plan: SweepPlan) -> Accumulator:
    """An empty accumulator for the fields of a sweep plan."""
    specs = sweep_specs(plan.modes, plan.n_controls)
    return Accumulator(
        specs, layers=plan.unit_layers, heads=plan.unit_heads, n_grid=torch.tensor(plan.n_grid),
        n_bootstrap=plan.n_bootstrap, replicate_fields=[s.name for s in specs if s.bootstrap],
        axis_sizes={"control": plan.n_controls},
    )


def document_nll(
    logits: Float[Tensor, "batch pos vocab"], tokens: Int[Tensor, "batch pos"], real: Bool[Tensor, "batch pos"]
) -> Float[Tensor, " batch"]:
    """Each sequence's mean next-token NLL (nats, float64) over the real tokens that follow a real token.

    >>> logits = torch.zeros(1, 3, 4)  # uniform over 4 tokens: NLL = log 4 everywhere
    >>> round(document_nll(logits, torch.tensor([[0, 1, 2]]), torch.ones(1, 3, dtype=torch.bool)).item(), 6)
    1.386294
    """
    pred = logits[:, :-1]
    pred = pred.to(working_dtype(pred))  # float32 at least, float64 when the model runs in it
    target = tokens[:, 1:].to(pred.device)
    nll = torch.logsumexp(pred, dim=-1) - pred.gather(-1, target[..., None]).squeeze(-1)
    counted = (real[:, 1:] & real[:, :-1]).to(pred.device)
    if bool((counted.sum(-1) == 0).any()):
        raise GeometryError("tokens: a sequence has fewer than 2 real tokens, so no next-token NLL; drop it")
    return (nll.double() * counted).sum(-1) / counted.sum(-1)


def document_seeds(documents: Sequence[Tensor]) -> Int[Tensor, " doc"]:
    """A 31-bit seed per document from a SHA-256 of its token ids: its random controls follow it across batches."""
    import hashlib

    return torch.tensor([int.from_bytes(hashlib.sha256(d.cpu().to(torch.int64).numpy().astype("<i8").tobytes())
                                        .digest()[:4], "little") & 0x7FFFFFFF for d in documents])


def _hooks_for(plan: SweepPlan, cut_layers: Sequence[int], cut_heads: Sequence[int] | None, n: int, mode: str,
               ranking: str, control: int, mask: Tensor | None, row_seeds: Tensor,
               control_ranks: ControlRankCache | None) -> list[tuple[str, Any]]:
    hooks: list[tuple[str, Any]] = []
    for layer in cut_layers:
        hook = topn_pattern_hook(n, mode, ranking, cut_heads, window=plan.windows[layer],  # type: ignore[arg-type]
                                 attention_mask=mask, control=control, seed=plan.seed, layer=layer, row_seeds=row_seeds,
                                 control_ranks=control_ranks)
        if ranking == "contribution":
            hooks.append((value_hook(layer), hook.value_hook))
        hooks.append((pattern_hook(layer), hook))
    return hooks


def _stacked_hooks(per_setting: list[list[tuple[str, Any]]], rows: int) -> list[tuple[str, Any]]:
    """One hook per hook point that applies setting k's hook to batch rows ``k * rows`` to ``(k + 1) * rows``.

    Every setting's list names the same hook points in the same order (the
    same intervened layers); a hook that returns None leaves its slice as is.
    """
    stacked = []
    for position, (name, _) in enumerate(per_setting[0]):
        fns = [hooks[position][1] for hooks in per_setting]

        def apply(x: Tensor, *, hook: Any, fns: list[Any] = fns) -> Tensor | None:
            slices = [x[k * rows : (k + 1) * rows] for k in range(len(fns))]
            edited = [fn(part, hook=hook) for fn, part in zip(fns, slices, strict=True)]
            if all(e is None for e in edited):
                return None
            return torch.cat([part if e is None else e for part, e in zip(slices, edited, strict=True)])

        stacked.append((name, apply))
    return stacked


def _repeat(x: Tensor, times: int) -> Tensor:
    """``x`` stacked ``times`` along its first (batch) axis."""
    return x if times == 1 else x.repeat(times, *([1] * (x.ndim - 1)))


def sweep_batch(model: HookableModel, prepared: PreparedTokens, plan: SweepPlan, accumulator: Accumulator,
                progress: Any = None) -> None:
    """Run every setting of ``plan`` on one batch of windows and add its documents to ``accumulator``."""
    device = getattr(model.cfg, "device", None)
    tokens = prepared.tokens if device is None else prepared.tokens.to(device)
    kwargs: dict[str, Any] = {}
    mask = None
    if prepared.padded:
        if not accepts_attention_mask(model):
            raise GeometryError("tokens: the windows are padded but this model's forward takes no attention_mask; "
                                "use windows of equal length")
        mask = prepared.real.long().to(tokens.device)
        kwargs["attention_mask"] = mask
    residuals: dict[int, Tensor] = {}
    documents = prepared.documents()
    row_seeds = document_seeds(documents).to(tokens.device)

    def keep_residual(x: Tensor, *, hook: Any, layer: int) -> None:
        residuals[layer] = x.clone()

    capture = [(resid_hook(layer), partial(keep_residual, layer=layer)) for layer in plan.layers] if plan.reuse_residual else []
    with torch.inference_mode():
        with model.hooks(fwd_hooks=capture):
            clean = document_nll(model(tokens, **kwargs), tokens, prepared.real)
        n_docs, n_grid = len(clean), len(plan.n_grid)
        shape = (n_docs, len(plan.unit_layers), len(plan.unit_heads), n_grid)
        dnll = {mode: torch.full(shape, float("nan"), dtype=torch.float64) for mode in plan.modes}
        ctrl = {mode: torch.full((*shape, plan.n_controls), float("nan"), dtype=torch.float64) for mode in plan.modes}
        # Control by control, so that a control's order is ranked once for all its N and modes, then dropped.
        settings = [(mode, k, n, control) for control in range(plan.n_controls + 1) for mode in plan.modes
                    for k, n in enumerate(plan.n_grid)]
        rows = len(tokens)
        for i, j, cut_layers, cut_heads in plan.units():
            start = min(cut_layers) if plan.reuse_residual else None
            source = residuals[start] if start is not None else tokens
            # Each control's orders, kept on their layer's device within control_cache_mib per device.
            control_ranks = ControlRankCache(plan.control_cache_mib) if plan.n_controls else None
            for first in range(0, len(settings), plan.settings_per_pass):
                group = settings[first : first + plan.settings_per_pass]
                if control_ranks is not None:
                    control_ranks.drop_controls_before(group[0][3])
                per_setting = [
                    _hooks_for(plan, cut_layers, cut_heads, n, mode, plan.ranking if control == 0 else "random",
                               control, mask, row_seeds, control_ranks)
                    for mode, _, n, control in group
                ]
                hooks = per_setting[0] if len(group) == 1 else _stacked_hooks(per_setting, rows)
                extra = {name: _repeat(t, len(group)) for name, t in kwargs.items()}
                if start is not None:
                    extra["start_at_layer"] = start
                with model.hooks(fwd_hooks=hooks), blocks_below_skipped(model, start or 0):
                    logits = model(_repeat(source, len(group)), **extra)
                nll = document_nll(logits, _repeat(tokens, len(group)), _repeat(prepared.real, len(group)))
                for (mode, k, _, control), part in zip(group, nll.view(len(group), rows), strict=True):
                    if control == 0:
                        dnll[mode][:, i, j, k] = (part - clean).cpu()
                    else:
                        ctrl[mode][:, i, j, k, control - 1] = (part - clean).cpu()
                if progress is not None:
                    progress.update(len(group))
    values: dict[str, Tensor] = {CLEAN_FIELD.name: clean.cpu()[:, None, None].expand(shape[:3]).contiguous()}
    for mode in plan.modes:
        values[dnll_spec(mode).name] = dnll[mode]
        if plan.n_controls:
            values[control_spec(mode).name] = ctrl[mode]
            values[control_mean_spec(mode).name] = ctrl[mode].mean(-1)
    weights = document_weights([d.cpu() for d in documents], plan.n_bootstrap, plan.seed)
    accumulator.add(values, weights, n_tokens=sum(len(d) for d in documents))


def result_of(model: HookableModel, plan: SweepPlan, accumulator: Accumulator) -> InterventionResult:
    """The InterventionResult of an accumulator filled by `sweep_batch`."""
    return InterventionResult(
        n_grid=accumulator.n_grid.clone(), layers=accumulator.layers, heads=accumulator.heads,
        stats=accumulator.stored_stats(), scope=plan.scope, modes=plan.modes, ranking=plan.ranking,
        n_controls=plan.n_controls, intervened_layers=plan.layers, intervened_heads=plan.heads,
        n_documents=accumulator.n_documents, n_tokens=accumulator.n_tokens, seed=plan.seed,
        model_name=model_name(model), versions=package_versions(STAMPED),
    )


def intervention_sweep(
    model: HookableModel | Any,
    corpus: Any,
    n_grid: Sequence[int],
    *,
    modes: Sequence[str] = ("renormalise", "delete"),
    scope: str = "model",
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    controls: int = DEFAULT_CONTROLS,
    ranking: str = "attention",
    seed: int = 0,
    n_bootstrap: int = DEFAULT_BOOTSTRAP,
    batch_size: int = 8,
    prepend_bos: bool = True,
    reuse_residual: bool | None = None,
    settings_per_pass: int = 1,
    control_cache_mib: int | float = 1024,
    progress: bool = True,
    tokenizer: Any = None,
) -> InterventionResult:
    """dNLL of top-N interventions, per scope unit, mode, N and random control, over a corpus.

    Every (unit, mode, N, control) is one forward pass per batch of windows;
    the clean pass is shared. The cost is the product: keep ``controls`` and
    the grid small for ``scope="head"``. Under ``torchrun`` (an initialised
    process group) each rank sweeps every K-th window and every rank returns
    the reduced sweep of the whole corpus.

    Args:
        model: a TransformerLens model whose ``hook_pattern`` edits reach the
            logits (checked once per layer, `tl_geometry.interventions.topn_attention.check_pattern_edits`), or a
            ``transformers`` causal LM or nnsight ``LanguageModel``, wrapped once into a bridge whose edits
            do (`tl_geometry.capture.held_models`; the model is left as it was).
        corpus: texts, a ``[sequence, pos]`` token tensor, or an iterable of
            ``[batch, pos]`` token tensors (as `tl_geometry.analyze_corpus`); each sequence is one document.
        n_grid: the N values (increasing), e.g. powers of two ``[1, 2, 4, ..., 256]`` (`DEFAULT_SWEEP_GRID`).
        modes: ``"renormalise"`` and/or ``"delete"``.
        scope: ``"model"`` (every layer and head at once), ``"layer"`` (one
            layer at a time) or ``"head"`` (one head of one layer at a time).
        layers: the layers intervened (None: all).
        heads: the heads intervened (None: all).
        controls: random rankings per setting (nested across N), 0 for none.
        ranking: ``"attention"`` or ``"contribution"``.
        seed: seeds the random controls and the bootstrap weights.
        n_bootstrap: Poisson document-bootstrap replicates.
        batch_size: windows per forward pass.
        prepend_bos: for texts, prepend BOS to every window.
        reuse_residual: start layer/head-scope passes from the clean residual at
            the intervened layer (None: where the model supports ``start_at_layer``).
        settings_per_pass: (mode, N, control) settings run in one forward pass,
            stacked along the batch: fewer, larger passes (faster where small
            batches leave the hardware idle), with activation memory growing
            as ``settings_per_pass x batch_size`` windows. The results are the
            same up to float rounding.
        control_cache_mib: memory (MiB) per device for keeping each random
            control's order of the intervened rows while its N and modes run
            (ranked once instead of once per pass). An order lives on the
            device of its layer (``device_map``: each device keeps its own
            layers' orders within this budget); one that would not fit ranks
            in every pass instead. 0 turns the cache off; the results are the
            same either way.
        progress: show a progress bar over the settings.
        tokenizer: for a ``transformers`` or nnsight model, its tokenizer (as in `tl_geometry.run_with_geometry_hooks`).

    Returns:
        InterventionResult (``result.dnll("renormalise")`` is ``[layer, head_index, n]``).

    Example:
        >>> sweep = intervention_sweep(model, texts, [1, 4, 16], scope="layer")  # doctest: +SKIP
        >>> sweep.relative("renormalise")[:, 0]  # [layer, n]  # doctest: +SKIP
    """
    model = as_hookable(model, tokenizer, compatibility_mode=True)
    plan = make_plan(model, n_grid, modes=modes, scope=scope, layers=layers, heads=heads, ranking=ranking,
                     controls=controls, seed=seed, n_bootstrap=n_bootstrap, reuse_residual=reuse_residual,
                     settings_per_pass=settings_per_pass, control_cache_mib=control_cache_mib)
    check_pattern_edits(model, plan.layers)
    batches, ranks = _my_batches(model, corpus, plan, prepend_bos, batch_size)
    accumulator = new_sweep_accumulator(plan)
    total = plan.passes_per_batch * len(batches)
    with tqdm(total=total, desc="tl_geometry: top-N sweep", unit="setting", disable=not (progress and ranks.is_main)) as bar:
        for batch in batches:
            sweep_batch(model, batch, plan, accumulator, bar)
    return result_of(model, plan, distributed.reduce_accumulator(accumulator))


def _unit_text(layer: int, head: int) -> str:
    """A search unit as the progress bar names it: ``every head``, ``layer 3`` or ``L3H5`` (not "3.5", read as a number)."""
    if layer == ALL:
        return "every head"
    return f"layer {layer}" if head == ALL else head_name(layer, head)


def _my_batches(
    model: HookableModel, corpus: Any, plan: "SweepPlan", prepend_bos: bool, batch_size: int
) -> tuple[list[PreparedTokens], distributed.Ranks]:
    """This process's share of the corpus, tokenised: every window under one process, every K-th under torchrun.

    Under torchrun the ranks first agree on the plan (a rank started with
    other arguments is refused on every rank, naming the difference).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise GeometryError(f"batch_size: expected a positive integer, got {batch_size!r}")
    ranks = distributed.current_ranks()
    distributed.agree("model and sweep plan", (model_name(model), plan, prepend_bos))
    batches = prepared_batches(model, corpus, GeometryConfig(prepend_bos=prepend_bos), batch_size, ranks)
    return batches, ranks


def effective_set_size(
    model: HookableModel | Any,
    corpus: Any,
    *,
    taus: Sequence[float] = DEFAULT_TAUS,
    mode: str = "renormalise",
    scope: str = "model",
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    ranking: str = "attention",
    max_n: int | None = None,
    seed: int = 0,
    n_bootstrap: int = DEFAULT_BOOTSTRAP,
    batch_size: int = 8,
    prepend_bos: bool = True,
    reuse_residual: bool | None = None,
    settings_per_pass: int = 1,
    progress: bool = True,
    tokenizer: Any = None,
) -> EffectiveSetSize:
    """N*_tau, the smallest N whose relative dNLL is at most tau, per model, layer or head, with bootstrap intervals.

    The search of the follow-up protocol (powers of two, bisection, +-3; see
    `tl_geometry.analysis.sweep_statistics.search_n_star`) runs unit by unit: each
    unit's sweep measures the N its own search asks for, in rounds, on the whole corpus.

    Args:
        taus: relative-dNLL tolerances (default 1 %, 5 %, 10 %).
        mode: the intervention mode.
        scope: ``"model"``, ``"layer"`` or ``"head"`` (one search per unit).
        max_n: the largest N searched (default: the longest window's tokens).
        model: as `intervention_sweep`; likewise corpus, layers, heads, ranking, seed,
            n_bootstrap, batch_size, prepend_bos, reuse_residual, settings_per_pass, progress and
            tokenizer (no random controls).

    Returns:
        EffectiveSetSize (``n_star[tau, layer, head_index]``, ``low``, ``high``, the sweeps).
    """
    model = as_hookable(model, tokenizer, compatibility_mode=True)
    plan = make_plan(model, [1], modes=(mode,), scope=scope, layers=layers, heads=heads, ranking=ranking, controls=0,
                     seed=seed, n_bootstrap=n_bootstrap, reuse_residual=reuse_residual,
                     settings_per_pass=settings_per_pass)
    check_pattern_edits(model, plan.layers)
    batches, ranks = _my_batches(model, corpus, plan, prepend_bos, batch_size)
    if max_n is None:  # the longest window of any rank's share
        max_n = distributed.agree_on_max(max((int(b.real.sum(-1).max()) for b in batches), default=1))
    powers = sorted({min(2**k, max_n) for k in range(max_n.bit_length() + 1)})
    parts = []
    units = [(layer, head) for layer in plan.unit_layers for head in plan.unit_heads]
    # The search's rounds are not known in advance: the bar counts forward passes (a round of each unit
    # measures the N its search asks for) and names the unit and the N being measured.
    bar = tqdm(desc="tl_geometry: N*_tau search", unit="pass", disable=not (progress and ranks.is_main))
    with bar:
        for index, (layer, head) in enumerate(units):
            unit_layers = plan.layers if layer == ALL else (layer,)
            unit_heads = plan.heads if head == ALL else (head,)
            unit_scope = "model" if layer == ALL else ("layer" if head == ALL else "head")
            grid = powers
            sweep = None
            while grid:
                bar.set_postfix_str(f"{_unit_text(layer, head)} ({index + 1} of {len(units)}), N = "
                                    f"{','.join(map(str, grid))}", refresh=False)
                unit_plan = make_plan(model, grid, modes=(mode,), scope=unit_scope, layers=unit_layers,
                                      heads=unit_heads, ranking=ranking, controls=0, seed=seed,
                                      n_bootstrap=n_bootstrap, reuse_residual=plan.reuse_residual,
                                      settings_per_pass=settings_per_pass)
                accumulator = new_sweep_accumulator(unit_plan)
                for batch in batches:
                    sweep_batch(model, batch, unit_plan, accumulator, bar)
                # Every rank gets the same reduced sweep, hence the same next grid: the ranks search in step.
                measured = result_of(model, unit_plan, distributed.reduce_accumulator(accumulator))
                sweep = measured if sweep is None else sweep.join_n(measured)
                grid = sorted(n_star_needs(sweep, mode, taus, max_n))
            parts.append(n_star_of(sweep, mode, taus, max_n))
    if len(parts) == 1:
        return parts[0]
    return stack_n_star(parts, plan.unit_layers, plan.unit_heads)
