"""analyze_corpus: the geometry hooks over a corpus, one batch of activations at a time."""

import os
from collections.abc import Iterable
from typing import Any

from torch import Tensor
from tqdm.auto import tqdm

from tl_geometry.capture import distributed
from tl_geometry.capture.checkpoint import DEFAULT_CHECKPOINT_EVERY, Checkpoint, CheckpointEvery, shard_fingerprint
from tl_geometry.capture.distributed import Ranks
from tl_geometry.capture.hooks import analyse_prepared, model_name, most_visible_keys, new_accumulator
from tl_geometry.capture.tokens import HookableModel, PreparedTokens, prepare_tokens
from tl_geometry.config import GeometryConfig, make_config
from tl_geometry.errors import GeometryError
from tl_geometry.results.result import GeometryResult

DEFAULT_BATCH_SIZE = 8


def _shard_batches(corpus: Any, ranks: Ranks, batch_size: int) -> list[list[str] | Tensor]:
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


def _n_windows(batches: list[PreparedTokens]) -> int:
    return sum(len(batch.tokens) for batch in batches)


def analyze_corpus(
    model: HookableModel,
    texts_or_token_batches: Any,
    config: GeometryConfig | None = None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = True,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: Any = DEFAULT_CHECKPOINT_EVERY,
    **overrides: Any,
) -> GeometryResult:
    """Selection metrics over a corpus, batch after batch, equal to analysing it all at once.

    The N grid is fixed once for the whole corpus (from the longest query),
    so every batch reports the same N. Each sequence is one document; the
    result keeps exact statistics over documents (memory flat in their
    number), so batching never changes it.

    Under ``torchrun`` (an initialised ``torch.distributed`` process group;
    the command joins it itself), each rank analyses the windows whose index
    modulo the number of ranks is its rank, the ranks agree on the N grid
    first, and the accumulators are reduced once at the end: every rank
    returns the result of the whole corpus (equal to a one-process run up to
    float64 rounding). Progress is shown on rank 0 only.

    Args:
        model: a TransformerLens model (see `tl_geometry.run_with_geometry_hooks`).
        texts_or_token_batches: a list of strings (one sequence each), a
            ``[sequence, pos]`` token tensor, or an iterable of ``[batch, pos]``
            token tensors (each run as one batch).
        config: the GeometryConfig (default ``GeometryConfig()``).
        batch_size: sequences per forward pass for texts and a single tensor.
        progress: show a tqdm progress bar (windows, tokens per second, time left).
        checkpoint: a file to checkpoint the run in. If it exists (from a run
            with the same arguments that was interrupted), the run resumes
            from it and ends with exactly the uninterrupted result; a
            checkpoint of other arguments is refused. Deleted when the run
            finishes. Under torchrun each rank uses ``PATH.rankR-of-K``.
        checkpoint_every: when to write it: a number of windows (``500``) or
            a duration (``"90s"``, ``"5m"``, a ``timedelta``); default every
            five minutes of work.
        **overrides: config fields to replace.

    Returns:
        GeometryResult over every sequence (of every rank).

    Raises:
        GeometryError: a bad corpus, batch size, config or checkpoint; ranks
            started with different arguments.
    """
    config = make_config(config, overrides)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise GeometryError(f"batch_size: expected a positive integer, got {batch_size!r}")
    every = CheckpointEvery.parse(checkpoint_every)
    ranks = distributed.current_ranks()
    batches = [prepare_tokens(model, unit, config) for unit in _shard_batches(texts_or_token_batches, ranks, batch_size)]
    name = model_name(model)
    distributed.agree("model and config", (name, config.to_json(), batch_size))
    # Every rank must use the same N grid: agree on the most keys any query of any shard sees.
    grid = config.resolve_n_grid(distributed.agree_on_max(most_visible_keys(model, batches, config)))
    accumulator = new_accumulator(model, config, grid)
    run = None
    done_batches = done_windows = 0
    if checkpoint is not None:
        identity = {
            "model": name,
            "config": config.to_json(),
            "batch_size": batch_size,
            "ranks": f"{ranks.rank} of {ranks.world_size}",
            "windows": _n_windows(batches),
            "tokens_sha256": shard_fingerprint(batches),
            "n_grid": grid.tolist(),
        }
        run = Checkpoint(checkpoint, every, identity, ranks)
        refused = None
        try:
            done_batches, done_windows = run.resume(accumulator)
        except GeometryError as error:
            refused = str(error)
        # A checkpoint refused on one rank stops every rank (the others would wait for it at the reduction).
        refusals = [message for message in distributed.gather_objects(refused) if message]
        if refusals:
            raise GeometryError(refusals[0] if refused is None else refused)
    total = _n_windows(batches) * ranks.world_size  # the bar of rank 0 speaks for every rank
    with tqdm(
        total=total,
        initial=done_windows * ranks.world_size,
        desc="tl_geometry: analysing",
        unit="window",
        disable=not (progress and ranks.is_main),
    ) as bar:
        tokens = 0
        for i, batch in enumerate(batches[done_batches:], start=done_batches + 1):
            analyse_prepared(model, batch, config, accumulator)
            done_windows += len(batch.tokens)
            tokens += int(batch.real.sum())
            bar.set_postfix_str(f"{tokens * ranks.world_size / max(bar.format_dict['elapsed'], 1e-3):,.0f} tok/s",
                                refresh=False)
            bar.update(len(batch.tokens) * ranks.world_size)
            if run is not None:
                run.step(accumulator, i, done_windows, len(batch.tokens))
    accumulator = distributed.reduce_accumulator(accumulator)
    result = GeometryResult.from_accumulator(accumulator, config=config, model_name=name)
    if run is not None:
        distributed.barrier()  # every rank has its share of the result before any checkpoint goes
        run.remove()
    return result
