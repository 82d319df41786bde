"""The taxonomy's query sample: one position per stratum, seeded by the tokens, the same in any batch."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import tiny_models as tm
from tl_geometry.capture.query_sample import offsets_from_first, sample_queries, strata_positions
from tl_geometry.capture.tokens import prepare_tokens
from tl_geometry.config import GeometryConfig


@settings(max_examples=200, deadline=None)
@given(last=st.integers(1, 5000), n=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_one_position_in_each_stratum(last, n, seed):
    uniform = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    positions = strata_positions(last, n, uniform)
    k = min(n, last)
    assert len(positions) == k and positions == sorted(set(positions))
    assert 1 <= positions[0] and positions[-1] <= last
    for j, p in enumerate(positions):  # stratum j of 1..last, written out from its definition
        low, high = 1 + (j * last) // k, ((j + 1) * last) // k
        assert low <= p <= high


def test_the_sample_depends_on_the_tokens_and_seed_only():
    model = tm.tiny_bridge("gpt2")
    texts = ["the cat sat on the mat and ran far away", "a dog", "one two three four five six seven eight nine"]
    together = sample_queries(prepare_tokens(model, texts, GeometryConfig()), 4, seed=0)
    for i, text in enumerate(texts):
        alone = sample_queries(prepare_tokens(model, [text], GeometryConfig()), 4, seed=0)
        kept = offsets_from_first(together)[i]
        assert kept[kept >= 0].tolist() == offsets_from_first(alone)[0][offsets_from_first(alone)[0] >= 0].tolist()
    other = sample_queries(prepare_tokens(model, texts, GeometryConfig()), 4, seed=1)
    assert not torch.equal(offsets_from_first(together), offsets_from_first(other))
