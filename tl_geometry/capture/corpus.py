"""analyze_corpus: the geometry hooks over a corpus, one batch of activations at a time."""

from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm
from torch import Tensor

from tl_geometry.config import GeometryConfig, make_config
from tl_geometry.errors import GeometryError
from tl_geometry.capture.hooks import analyse_prepared, grid_for, model_name, new_accumulator
from tl_geometry.capture.tokens import HookableModel, PreparedTokens, prepare_tokens
from tl_geometry.results.result import GeometryResult

DEFAULT_BATCH_SIZE = 8


def _batches(model: HookableModel, corpus: Any, config: GeometryConfig, batch_size: int) -> list[PreparedTokens]:
    """Tokenised batches: texts and the rows of one token tensor are cut into ``batch_size`` rows;
    an iterable of token tensors is taken batch by batch as given. Token ids are cheap to hold;
    only activations are kept to one batch at a time."""
    if isinstance(corpus, str):
        corpus = [corpus]
    if isinstance(corpus, Tensor):
        return [prepare_tokens(model, rows, config) for rows in corpus.split(batch_size)]
    if not isinstance(corpus, Iterable):
        raise GeometryError(
            f"texts_or_token_batches: expected a list of strings, a [sequence, pos] token tensor or an "
            f"iterable of [batch, pos] token tensors, got {type(corpus).__name__}"
        )
    items = list(corpus)
    if not items:
        raise GeometryError("texts_or_token_batches: the corpus is empty; pass at least one text or batch")
    if all(isinstance(item, str) for item in items):
        return [prepare_tokens(model, items[i : i + batch_size], config) for i in range(0, len(items), batch_size)]
    if all(isinstance(item, Tensor) for item in items):
        return [prepare_tokens(model, item, config) for item in items]
    kinds = sorted({type(item).__name__ for item in items})
    raise GeometryError(
        f"texts_or_token_batches: mixes or holds unsupported items {kinds}; pass only strings or only token tensors"
    )


def analyze_corpus(
    model: HookableModel,
    texts_or_token_batches: Any,
    config: GeometryConfig | None = None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = True,
    **overrides: Any,
) -> GeometryResult:
    """Selection metrics over a corpus, batch after batch, equal to analysing it all at once.

    The N grid is fixed once for the whole corpus (from the longest query),
    so every batch reports the same N. Each sequence is one document; the
    result keeps exact statistics over documents (memory flat in their
    number), so batching never changes it.

    Args:
        model: a TransformerLens model (see `tl_geometry.run_with_geometry_hooks`).
        texts_or_token_batches: a list of strings (one sequence each), a
            ``[sequence, pos]`` token tensor, or an iterable of ``[batch, pos]``
            token tensors (each run as one batch).
        config: the GeometryConfig (default ``GeometryConfig()``).
        batch_size: sequences per forward pass for texts and a single tensor.
        progress: show a tqdm progress bar.
        **overrides: config fields to replace.

    Returns:
        GeometryResult over every sequence.
    """
    config = make_config(config, overrides)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise GeometryError(f"batch_size: expected a positive integer, got {batch_size!r}")
    batches = _batches(model, texts_or_token_batches, config, batch_size)
    accumulator = new_accumulator(model, config, grid_for(model, batches, config))
    for batch in tqdm(batches, desc="tl_geometry: analysing", unit="batch", disable=not progress):
        analyse_prepared(model, batch, config, accumulator)
    return GeometryResult.from_accumulator(accumulator, config=config, model_name=model_name(model))
