"""Merging results with selection pictures: any order and any grouping keep, per head, the picture of the
smallest document hash, and results without pictures merge with those that have them."""

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_geometry.config import GeometryConfig
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.selection_picture import SelectionPicture
from tl_geometry.results.result import GeometryResult

GRID = torch.tensor([1, 2])
HEADS = ((0, 0), (0, 1), (1, 1))


def fake_picture(layer: int, head: int, document: int) -> SelectionPicture:
    """A well-formed picture whose values come from its document (so that two documents differ)."""
    gen = torch.Generator().manual_seed(document)
    n_keys = 2 + document % 3
    return SelectionPicture(
        layer=layer, head=head, document=document, query_position=n_keys - 1, sink=0, distance="euclidean",
        ranking="attention", positions=torch.arange(n_keys), alpha=torch.rand(n_keys, generator=gen),
        y=torch.randn(n_keys, 3, generator=gen), order=torch.randperm(n_keys, generator=gen), n_grid=GRID.clone(),
        s=torch.randn(2, 3, generator=gen), r_max=torch.rand(2, generator=gen), r_min=torch.rand(2, generator=gen),
        precision=torch.rand(2, generator=gen), recall=torch.rand(2, generator=gen),
        in_r_max=torch.rand(2, n_keys, generator=gen) > 0.5, in_r_min=torch.rand(2, n_keys, generator=gen) > 0.5,
    )  # fmt: skip


def part(documents: list[int], heads: tuple) -> GeometryResult:
    """A result over ``documents`` whose pictures are those of its smallest document for ``heads``."""
    acc = Accumulator([FieldSpec("recall", "R", axes=("n",))], layers=(0, 1), heads=(0, 1), n_grid=GRID)
    acc.add({"recall": torch.rand(len(documents), 2, 2, 2)}, torch.zeros(len(documents), 0), n_tokens=len(documents))
    first = min(documents) if documents else None
    pictures = tuple(fake_picture(layer, head, first) for layer, head in heads) if documents else ()
    return dataclasses.replace(GeometryResult.from_accumulator(acc, config=GeometryConfig(picture_heads=heads),
                                                               model_name="toy"), pictures=pictures)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**62), min_size=1, max_size=8, unique=True), st.integers(1, 4),
       st.lists(st.sampled_from(HEADS), unique=True, max_size=3), st.randoms(use_true_random=False))
def test_merge_keeps_the_smallest_document_in_any_order_and_grouping(documents, n_parts, heads, rng):
    heads = tuple(sorted(heads))
    shuffled = list(documents)
    rng.shuffle(shuffled)
    cuts = sorted(rng.sample(range(1, len(shuffled)), min(n_parts - 1, len(shuffled) - 1)))
    groups = [shuffled[a:b] for a, b in zip([0, *cuts], [*cuts, len(shuffled)])]
    # Some parts were analysed without pictures: they merge all the same.
    parts = [part(g, heads if i % 2 == 0 or len(groups) == 1 else ()) for i, g in enumerate(groups)]
    flat = GeometryResult.merge(parts)
    rng.shuffle(parts)
    nested = parts[0]
    for p in parts[1:]:
        nested = p.merge(nested) if rng.random() < 0.5 else nested.merge(p)
    with_pictures = [d for i, g in enumerate(groups) for d in g if i % 2 == 0 or len(groups) == 1]
    for result in (flat, nested):
        assert result.config.picture_heads == heads
        assert [(p.layer, p.head) for p in result.pictures] == (list(heads) if with_pictures else [])
        for p in result.pictures:
            assert p.equals(fake_picture(p.layer, p.head, min(with_pictures)))
    assert all(a.equals(b) for a, b in zip(flat.pictures, nested.pictures)) and len(flat.pictures) == len(nested.pictures)


def test_fake_pictures_differ_by_document():
    assert not fake_picture(0, 0, 1).equals(fake_picture(0, 0, 2))
