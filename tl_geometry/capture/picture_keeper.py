"""Pictures of a run: the whole selection of a few chosen heads, kept as the selection diagnostic computes it.

With ``config.picture_heads``, a `PictureKeeper` observes the selection
diagnostic's rows chunk by chunk (the hooks call it right after that
diagnostic, whose proximity plane it reads) and keeps, for each chosen head,
the row of the last analysed query of one document of the batch: the one of
the smallest hash, so that which row is kept does not depend on how the
corpus was batched or sharded.
"""

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from tl_geometry.capture.plan import RunPlan
from tl_geometry.capture.tokens import PreparedTokens
from tl_geometry.diagnostics.registry import Diagnostic
from tl_geometry.diagnostics.selection import DIAGNOSTIC as SELECTION
from tl_geometry.diagnostics.selection import picture_rows
from tl_geometry.engine.context import SelectionChunk, SelectionContext
from tl_geometry.results.selection_picture import SelectionPicture, document_hash


def pictured_document(prepared: PreparedTokens) -> tuple[int, int] | None:
    """The batch index and hash of the document whose rows become pictures: the smallest hash with a query."""
    hashes = [(document_hash(d), i) for i, d in enumerate(prepared.documents()) if bool(prepared.query_valid[i].any())]
    if not hashes:
        return None
    document, batch = min(hashes)
    return batch, document


class PictureKeeper:
    """Keeps the pictures of one batch; `kept` holds them after the forward pass."""

    def __init__(self, prepared: PreparedTokens, plan: RunPlan) -> None:
        self.prepared, self.plan = prepared, plan
        self.document = pictured_document(prepared)
        self.kept: list[SelectionPicture] = []

    def observers(
        self, layer: int, context: SelectionContext, heads: Tensor
    ) -> dict[Diagnostic, Callable[[SelectionChunk, dict[str, Tensor]], None]]:
        """What to call, per diagnostic, on each chunk of ``layer``'s context: the selection diagnostic's
        rows when this layer has a pictured head (``heads``: the analysed heads, as the context's head axis)."""
        wanted = [head for pictured_layer, head in self.plan.config.picture_heads if pictured_layer == layer]
        if not wanted or self.document is None:
            return {}
        slots = (heads[:, None] == torch.tensor(wanted)).any(-1).nonzero().squeeze(-1).to(context.pattern.device)
        return {SELECTION: partial(self._keep, layer, context, heads, slots)}

    def _keep(self, layer: int, context: SelectionContext, heads: Tensor, slots: Tensor, chunk: SelectionChunk,
              rows: dict[str, Tensor]) -> None:
        """Keep the pictured heads' rows of the chosen document's last analysed query, if in this chunk."""
        batch, document = self.document  # type: ignore[misc]
        query = context.last_query_index()[batch]
        chosen = ((chunk.batch == batch) & (chunk.query == query) & torch.isin(chunk.head, slots)).nonzero().squeeze(-1)
        if len(chosen) == 0:
            return
        first = context.real[batch].int().argmax()
        query_position = int(self.prepared.query_index[batch, query].to(first.device) - first)
        for row, parts in zip(chosen.tolist(), picture_rows(chunk, rows, chosen, first.expand(len(chosen)))):
            head = int(heads[int(chunk.head[row])])
            self.kept.append(SelectionPicture(layer=layer, head=head, document=document,
                                              query_position=query_position, **parts))
