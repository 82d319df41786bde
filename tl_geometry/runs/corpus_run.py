"""analyze_corpus: the geometry hooks over a corpus, one batch of activations at a time.

Two kinds of input: texts and token tensors (tokenised up front, as before),
and streams of `Window` (from `tl_geometry.corpus_input.token_windows`), drawn lazily a
batch at a time so that neither the corpus nor its tokens are held whole.
Under ``torchrun`` each rank analyses every K-th window and the exact
statistics are reduced once at the end; with a checkpoint, an interrupted run
started again resumes where it stopped and ends with the uninterrupted result.
"""

import itertools
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from tl_geometry.capture.held_models import as_hookable
from tl_geometry.capture.hooks import analyse_prepared, model_name
from tl_geometry.capture.plan import RunPlan, plan_run
from tl_geometry.capture.tokens import HookableModel, PreparedTokens, check_model, prepare_tokens
from tl_geometry.config import GeometryConfig, make_config
from tl_geometry.corpus_input.token_windows import Window, WindowStream
from tl_geometry.errors import GeometryError
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.provenance import package_versions
from tl_geometry.results.result import GeometryResult
from tl_geometry.runs import distributed
from tl_geometry.runs.checkpoint import DEFAULT_CHECKPOINT_EVERY, Checkpoint, CheckpointEvery, shard_fingerprint
from tl_geometry.runs.distributed import Ranks
from tl_geometry.runs.model_provenance import model_provenance

DEFAULT_BATCH_SIZE = 8


@dataclass
class _CorpusPlan:
    """One rank's share of a corpus, ready to run.

    Attributes:
        batches: the rank's batches in corpus order (a list, or drawn lazily from a window stream).
        n_keys: the most keys a query of the rank's windows sees (the ranks agree on the largest).
        n_windows: the rank's windows, where known in advance.
        identity: what a checkpoint of this run must match, besides the model and config.
        corpus: the corpus part of the provenance, after the run.
    """

    batches: Iterator[PreparedTokens]
    n_keys: int
    n_windows: int | None
    identity: dict[str, Any]
    corpus: Callable[[Accumulator], dict[str, Any]]


def shard_batches(corpus: Any, ranks: Ranks, batch_size: int) -> list[list[str] | Tensor]:
    """This rank's batches, untokenised: lists of texts or ``[batch, pos]`` token tensors.

    Windows are dealt round-robin by their index in the corpus (rows of
    pre-batched tensors counted one after another), so a shard does not depend
    on the batching; with one process it is the whole corpus. Texts and the
    rows of one token tensor are cut into ``batch_size`` rows; pre-batched
    tensors keep their batches (less the rows of other ranks).
    """
    if isinstance(corpus, str):
        corpus = [corpus]
    if isinstance(corpus, Tensor):
        if corpus.ndim != 2:
            raise GeometryError(
                f"texts_or_token_batches: expected a [sequence, pos] token tensor, got shape {list(corpus.shape)}"
            )
        return list(corpus[ranks.rank :: ranks.world_size].split(batch_size))
    if not isinstance(corpus, Iterable):
        raise GeometryError(
            f"texts_or_token_batches: expected a list of strings, a [sequence, pos] token tensor or an "
            f"iterable of [batch, pos] token tensors, got {type(corpus).__name__}"
        )
    items = list(corpus)
    if not items:
        raise GeometryError("texts_or_token_batches: the corpus is empty; pass at least one text or batch")
    if all(isinstance(item, str) for item in items):
        mine = [text for i, text in enumerate(items) if ranks.owns(i)]
        return [mine[i : i + batch_size] for i in range(0, len(mine), batch_size)]
    if all(isinstance(item, Tensor) for item in items):
        if ranks.world_size == 1:
            return items
        shard, seen = [], 0
        for batch in items:
            if batch.ndim != 2:
                shard.append(batch)  # prepare_tokens names the problem
                continue
            rows = [i for i in range(len(batch)) if ranks.owns(seen + i)]
            seen += len(batch)
            if rows:
                shard.append(batch[rows])
        return shard
    kinds = sorted({type(item).__name__ for item in items})
    raise GeometryError(
        f"texts_or_token_batches: mixes or holds unsupported items {kinds}; pass only strings or only token tensors"
    )


def prepared_batches(
    model: HookableModel, corpus: Any, config: GeometryConfig, batch_size: int, ranks: Ranks = Ranks(0, 1)
) -> list[PreparedTokens]:
    """Texts or token tensors as tokenised batches (this rank's share; by default the whole corpus)."""
    return [prepare_tokens(model, unit, config) for unit in shard_batches(corpus, ranks, batch_size)]


def _token_plan(model: HookableModel, corpus: Any, run_plan: RunPlan, ranks: Ranks, batch_size: int) -> _CorpusPlan:
    """Texts and token tensors: this rank's shard, tokenised up front (token ids are cheap to hold)."""
    batches = prepared_batches(model, corpus, run_plan.config, batch_size, ranks)
    n_windows = sum(len(batch.tokens) for batch in batches)
    return _CorpusPlan(
        batches=iter(batches),
        n_keys=run_plan.visible_keys(batches),
        n_windows=n_windows,
        identity={"windows": n_windows, "tokens_sha256": shard_fingerprint(batches)},
        corpus=lambda accumulator: {"documents": accumulator.n_documents},
    )


def _window_plan(
    model: HookableModel, windows: Iterator[Window], stream: WindowStream | None, run_plan: RunPlan,
    ranks: Ranks, batch_size: int, progress: bool,
) -> _CorpusPlan:
    """Windows: this rank's (every K-th by position in the corpus), drawn ``batch_size`` at a time."""
    mine = (window for i, window in enumerate(windows) if ranks.owns(i))
    first = list(itertools.islice(mine, batch_size))
    for item in first:
        if not isinstance(item, Window):
            raise GeometryError(f"corpus: expected only Window items, got a {type(item).__name__}")
    if not first and ranks.world_size == 1:
        found = f" ({stream.report.summary()})" if stream is not None else ""
        raise GeometryError(f"corpus: no windows to analyse{found}; pass more or longer documents, or a smaller "
                            "context")
    # Every window is at most the stream's context long, so that length fixes the grid for all of them.
    context = stream.context if stream is not None else max((len(w.tokens) for w in first), default=1)
    probe = prepare_tokens(model, torch.zeros((1, context), dtype=torch.long), run_plan.config)

    def batches() -> Iterator[PreparedTokens]:
        batch = first
        while batch:
            if not all(isinstance(item, Window) for item in batch):
                kinds = sorted({type(item).__name__ for item in batch})
                raise GeometryError(f"corpus: expected only Window items, got {kinds}")
            yield _window_batch(model, batch, run_plan.config)
            batch = list(itertools.islice(mine, batch_size))

    def corpus(accumulator: Accumulator) -> dict[str, Any]:
        if stream is None:
            return {"windows": accumulator.n_documents}
        if progress and ranks.is_main and (stream.report.skipped or stream.report.tail_tokens):
            print(f"tl_geometry: {stream.report.summary()}", file=sys.stderr)
        return {"context": stream.context, "n_windows": stream.n_windows, "min_context": stream.min_context,
                "prepend_bos": stream.prepend_bos, **stream.report.to_json()}

    total = stream.n_windows if stream is not None else None
    shares = None if total is None else len(range(ranks.rank, total, ranks.world_size))
    identity = {"windows": {"context": context, "n_windows": total,
                            "min_context": None if stream is None else stream.min_context,
                            "prepend_bos": None if stream is None else stream.prepend_bos}}
    return _CorpusPlan(batches(), run_plan.visible_keys([probe]), shares, identity, corpus)


def _window_batch(model: HookableModel, windows: list[Window], config: GeometryConfig) -> PreparedTokens:
    """Windows as one batch: stacked, or right-padded with an attention mask when their lengths differ."""
    lengths = [len(w.tokens) for w in windows]
    width = max(lengths)
    if min(lengths) == width:
        return prepare_tokens(model, torch.stack([w.tokens for w in windows]), config)
    pad = getattr(getattr(model, "tokenizer", None), "pad_token_id", None) or 0
    tokens = torch.full((len(windows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(windows), width), dtype=torch.long)
    for row, (window, length) in enumerate(zip(windows, lengths, strict=True)):
        tokens[row, :length] = window.tokens
        mask[row, :length] = 1
    return prepare_tokens(model, tokens, config, attention_mask=mask)


def _corpus_plan(
    model: HookableModel, corpus: Any, run_plan: RunPlan, ranks: Ranks, batch_size: int, progress: bool
) -> _CorpusPlan:
    if isinstance(corpus, WindowStream):
        return _window_plan(model, iter(corpus), corpus, run_plan, ranks, batch_size, progress)
    if not isinstance(corpus, (str, Tensor)) and isinstance(corpus, Iterable):
        items = iter(corpus)
        head = list(itertools.islice(items, 1))
        corpus = itertools.chain(head, items)
        if head and isinstance(head[0], Window):
            return _window_plan(model, corpus, None, run_plan, ranks, batch_size, progress)
    return _token_plan(model, corpus, run_plan, ranks, batch_size)


def analyze_corpus(
    model: HookableModel | Any,
    texts_or_token_batches: Any,
    config: GeometryConfig | None = None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = True,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: Any = DEFAULT_CHECKPOINT_EVERY,
    tokenizer: Any = None,
    **overrides: Any,
) -> GeometryResult:
    """Selection metrics over a corpus, batch after batch, equal to analysing it all at once.

    The N grid is fixed once for the whole corpus (from the longest query;
    for a window stream, from its ``context``), so every batch reports the
    same N. Each sequence is one document; the result keeps exact statistics
    over documents (memory flat in their number), so batching never changes it.

    Under ``torchrun`` (an initialised ``torch.distributed`` process group;
    the command joins it itself), each rank analyses the windows whose index
    modulo the number of ranks is its rank, the ranks agree on the N grid
    first, and the accumulators are reduced once at the end: every rank
    returns the result of the whole corpus (equal to a one-process run up to
    float64 rounding). Progress is shown on rank 0 only.

    Args:
        model: a TransformerLens model, a ``transformers`` causal LM or an
            nnsight model (see `tl_geometry.run_with_geometry_hooks`), wrapped
            once for the whole corpus.
        texts_or_token_batches: a list of strings (one sequence each), a
            ``[sequence, pos]`` token tensor, an iterable of ``[batch, pos]``
            token tensors (each run as one batch), or windows: a
            `WindowStream` (`tl_geometry.read_corpus`,
            `tl_geometry.corpus.window_documents`) or any iterable of `Window`,
            read lazily ``batch_size`` windows at a time.
        config: the GeometryConfig (default ``GeometryConfig()``).
        batch_size: sequences per forward pass for texts, a single tensor and windows.
        progress: show a tqdm progress bar (windows, tokens per second, time
            left where the number of windows is known) and, at the end, what
            a window stream skipped.
        checkpoint: a file to checkpoint the run in. If it exists (from a run
            with the same arguments that was interrupted), the run resumes
            from it and ends with exactly the uninterrupted result; a
            checkpoint of other arguments is refused. Deleted when the run
            finishes. Under torchrun each rank uses ``PATH.rankR-of-K``.
        checkpoint_every: when to write it: a number of windows (``500``) or
            a duration (``"90s"``, ``"5m"``, a ``timedelta``); default every
            five minutes of work.
        tokenizer: for a ``transformers`` or nnsight model, its tokenizer
            (default: the nnsight model's, else the one saved with the model).
        **overrides: config fields to replace.

    Returns:
        GeometryResult over every sequence (of every rank), with its
        ``provenance`` (the model, package versions and the corpus report).

    Raises:
        GeometryError: a bad corpus, batch size, config or checkpoint; ranks
            started with different arguments.
    """
    model = as_hookable(model, tokenizer)
    check_model(model)
    config = make_config(config, overrides)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise GeometryError(f"batch_size: expected a positive integer, got {batch_size!r}")
    every = CheckpointEvery.parse(checkpoint_every)
    ranks = distributed.current_ranks()
    name = model_name(model)
    distributed.agree("model and config", (name, config.to_json(), batch_size))
    run_plan = plan_run(model, config)  # the layers, heads, diagnostics and capture path, once for every batch
    plan = _corpus_plan(model, texts_or_token_batches, run_plan, ranks, batch_size, progress)
    # Every rank must use the same N grid: agree on the most keys any query of any shard sees.
    run_plan = run_plan.with_grid(distributed.agree_on_max(plan.n_keys))
    accumulator = run_plan.new_accumulator()
    run = None
    done_batches = done_windows = 0
    if checkpoint is not None:
        identity = {"model": name, "config": config.to_json(), "batch_size": batch_size,
                    "ranks": f"{ranks.rank} of {ranks.world_size}", "n_grid": accumulator.n_grid.tolist(), **plan.identity}
        run = Checkpoint(checkpoint, every, identity, ranks, capture_taken=run_plan.capture)
        refused = None
        try:
            done_batches, done_windows = run.resume(accumulator)
        except GeometryError as error:
            refused = str(error)
        # A checkpoint refused on one rank stops every rank (the others would wait for it at the reduction).
        refusals = [message for message in distributed.gather_objects(refused) if message]
        if refusals:
            raise GeometryError(refusals[0] if refused is None else refused)
    total = None if plan.n_windows is None else plan.n_windows * ranks.world_size  # rank 0 speaks for all
    with tqdm(
        total=total,
        initial=done_windows * ranks.world_size,
        desc="tl_geometry: analysing",
        unit="window",
        disable=not (progress and ranks.is_main),
    ) as bar:
        tokens = 0
        # The batches a checkpoint holds are drawn again (to keep the stream's place) but not analysed.
        for i, batch in enumerate(plan.batches, start=1):
            if i <= done_batches:
                continue
            analyse_prepared(model, batch, run_plan, accumulator)
            done_windows += len(batch.tokens)
            tokens += int(batch.real.sum())
            bar.set_postfix_str(f"{tokens * ranks.world_size / max(bar.format_dict['elapsed'], 1e-3):,.0f} tok/s",
                                refresh=False)
            bar.update(len(batch.tokens) * ranks.world_size)
            if run is not None:
                run.step(accumulator, i, done_windows, len(batch.tokens))
    accumulator = distributed.reduce_accumulator(accumulator)
    provenance = {"model": model_provenance(model), "versions": package_versions(), "corpus": plan.corpus(accumulator),
                  **run_plan.provenance()}
    result = GeometryResult.from_accumulator(accumulator, config=run_plan.config, model_name=name, provenance=provenance)
    if run is not None:
        distributed.barrier()  # every rank has its share of the result before any checkpoint goes
        run.remove()
    return result
