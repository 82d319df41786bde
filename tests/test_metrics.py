"""The engine against the slow reference, and its input checks."""

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.reference import exact_counts, reference_metrics
from tl_geometry import GeometryError, selection_metrics
from tl_geometry.engine.context import rows_context
from tl_geometry.engine.metrics import METRICS_COST

RADII = ("r_min", "r_max", "s_norm")
COUNTS = ("k_in", "k_out", "precision", "recall", "f_rmax", "f_rmin", "f_score")


def assert_matches_reference(alpha, values, n_grid, key_mask=None, ranking="attention", distance="euclidean"):
    # Any non-negative weights against the reference (masked rows need not sum to 1): the row-sum check is apart.
    fast = selection_metrics(alpha, values, n_grid, key_mask=key_mask, ranking=ranking, distance=distance,
                             check_sums=False)
    grid = fast.n_grid.tolist()
    ref = reference_metrics(alpha, values, grid, key_mask, ranking, distance)
    for name in COUNTS:
        got = getattr(fast, name).reshape(ref[name].shape).double()
        assert torch.equal(torch.isnan(got), torch.isnan(ref[name])), name
        assert torch.equal(got.nan_to_num(-1.0), ref[name].nan_to_num(-1.0)), f"{name} differs from the reference"
    for name in RADII:
        got = getattr(fast, name).reshape(ref[name].shape).double()
        torch.testing.assert_close(got, ref[name], atol=1e-5, rtol=1e-5, equal_nan=True, msg=name)
    return fast


def random_rows(generator, shape, n_keys, d_head, dtype=torch.float64):
    alpha = torch.softmax(3 * torch.randn(*shape, n_keys, generator=generator, dtype=dtype), dim=-1)
    values = torch.randn(*shape, n_keys, d_head, generator=generator, dtype=dtype)
    return alpha, values


@pytest.mark.parametrize("ranking", ["attention", "contribution"])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("masked", [False, True])
def test_random_rows_match_reference(ranking, distance, masked):
    g = torch.Generator().manual_seed(0)
    alpha, values = random_rows(g, (3, 2), 12, 5)
    key_mask = torch.rand(3, 2, 12, generator=g) < 0.7 if masked else None
    assert_matches_reference(alpha, values, None, key_mask, ranking, distance)


@pytest.mark.parametrize("ranking", ["attention", "contribution"])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_tie_heavy_rows_match_reference(ranking, distance):
    # Dyadic weights and small-integer values: many equal scores, duplicate
    # vectors and equal distances, all exact in float64.
    g = torch.Generator().manual_seed(1)
    alpha = torch.randint(0, 4, (6, 10), generator=g).double() / 8
    values = torch.randint(-1, 2, (6, 10, 3), generator=g).double()
    key_mask = torch.rand(6, 10, generator=g) < 0.8
    assert_matches_reference(alpha, values, None, key_mask, ranking, distance)
    assert_matches_reference(alpha, values, [1, 3, 10, 12], None, ranking, distance)


def test_causal_mask_and_grid_beyond_visible_keys_is_nan():
    g = torch.Generator().manual_seed(2)
    alpha, values = random_rows(g, (8,), 8, 4)
    causal = torch.ones(8, 8, dtype=torch.bool).tril()  # row q sees keys 0..q
    fast = assert_matches_reference(alpha * causal, values, [1, 2, 5, 8, 9], causal)
    visible = causal.sum(-1, keepdim=True)
    assert torch.equal(torch.isnan(fast.precision), fast.n_grid > visible)
    everything = fast.n_grid == visible
    assert (fast.precision[everything] == 1).all() and (fast.recall[everything] == 1).all()
    assert torch.isinf(fast.r_min[everything]).all()


def dirichlet_rows(seed, n_rows, n_keys, d_head):
    """Rows with the spectrum of real attention: a few large weights and many down to 1e-30 or below."""
    torch.manual_seed(seed)
    concentration = torch.full((n_rows, n_keys), 0.1, dtype=torch.float64)
    alpha = torch.distributions.Dirichlet(concentration).sample().float()
    values = (torch.randn(n_rows, n_keys, d_head) * 3).float()
    return alpha, values


REALISTIC_GRID = [2, 4, 16, 48, 96, 127]


def test_realistic_dirichlet_rows_in_float32_match_exact_counts():
    """Float32 rows with the tiny weights of real attention still give the exact counts."""
    alpha, values = dirichlet_rows(3, 6, 128, 16)
    fast = selection_metrics(alpha, values, REALISTIC_GRID)
    assert (alpha < 1e-20).sum() > 10 and (alpha < 1e-8).sum() > 100  # as extreme as claimed
    for col, n in enumerate(REALISTIC_GRID):
        k_out, k_in = exact_counts(alpha, values, n)
        assert fast.k_out[:, col].tolist() == k_out, f"K_out at N={n}"
        assert fast.k_in[:, col].tolist() == k_in, f"K_in at N={n}"


def test_expanded_distance_formula_would_fail_on_realistic_rows():
    """Guard for the test above: the naive ||s||^2 + ||y||^2 - 2<s,y> in float32 miscounts these rows."""
    alpha, values = dirichlet_rows(3, 6, 128, 16)
    order = torch.sort(alpha, dim=-1, descending=True, stable=True).indices
    y = torch.gather(alpha.unsqueeze(-1) * values, 1, order.unsqueeze(-1).expand(-1, -1, values.shape[-1]))
    mismatches = 0
    for n in REALISTIC_GRID:
        s = y[:, :n].sum(1, keepdim=True)
        naive = (s * s).sum(-1) + (y * y).sum(-1) - 2 * (s * y).sum(-1)
        r_min = naive[:, n:].min(-1, keepdim=True).values
        k_in = (naive[:, :n] < r_min).sum(-1)
        mismatches += sum(a != b for a, b in zip(k_in.tolist(), exact_counts(alpha, values, n)[1], strict=True))
    assert mismatches > 0


def test_half_precision_inputs_are_computed_in_float32():
    g = torch.Generator().manual_seed(4)
    alpha, values = random_rows(g, (4,), 9, 8, dtype=torch.float32)
    half = selection_metrics(alpha.bfloat16(), values.bfloat16())
    assert half.precision.dtype == torch.float32
    full = selection_metrics(alpha.bfloat16().float(), values.bfloat16().float())
    assert torch.equal(half.k_out, full.k_out)


# 0.01 MiB: one row per chunk; 0.052 MiB: chunks of two rows sorted in blocks of three chunks (the last block short).
@pytest.mark.parametrize("budget", [0.01, 0.052])
@pytest.mark.parametrize("ranking", ["attention", "contribution"])
def test_chunking_does_not_change_results(budget, ranking):
    g = torch.Generator().manual_seed(5)
    alpha, values = random_rows(g, (7, 3), 40, 6, dtype=torch.float32)
    context = rows_context(alpha.reshape(21, 40), values.reshape(21, 40, 6), torch.ones(21, 40, dtype=torch.bool),
                           torch.arange(1, 41), ranking=ranking, distance="euclidean", memory_budget_mib=budget,
                           costs=(METRICS_COST,))
    blocks = {"attention": {0.01: (1, 1), 0.052: (2, 6)}, "contribution": {0.01: (1, 1), 0.052: (2, 2)}}
    assert (context.chunk_rows(), context.sort_block_rows()) == blocks[ranking][budget]  # the layout this test is for
    whole = selection_metrics(alpha, values, ranking=ranking)
    chunked = selection_metrics(alpha, values, ranking=ranking, memory_budget_mib=budget)
    for name, tensor in whole.per_row_fields().items():
        torch.testing.assert_close(getattr(chunked, name), tensor, rtol=0, atol=0, equal_nan=True, msg=name)


def test_single_row_and_shapes():
    m = selection_metrics(torch.tensor([0.5, 0.5]), torch.eye(2), [1, 2, 3])
    assert m.precision.shape == (3,) and m.n_grid.tolist() == [1, 2, 3]
    assert math.isnan(m.recall[2])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"values": torch.ones(2, 4, 3)}, "values: expected shape [*batch, key, d_head] = [2, 5, d_head]"),
        ({"alpha": torch.full((2, 5), math.nan)}, "alpha: contains 10 NaN or Inf entries"),
        ({"values": torch.full((2, 5, 3), math.inf)}, "values: contains 30 NaN or Inf entries"),
        ({"alpha": -torch.ones(2, 5)}, "alpha: attention weights must be >= 0, found 10 negative"),
        ({"alpha": torch.ones(2, 0), "values": torch.ones(2, 0, 3)}, "alpha: the key axis is empty"),
        ({"n_grid": [0, 1]}, "n_grid: every N must be >= 1, got 0"),
        ({"n_grid": [1.5]}, "n_grid: every N must be a whole number, got 1.5"),
        ({"n_grid": []}, "n_grid: expected at least one selection size N"),
        ({"n_grid": "all"}, "n_grid: expected a sequence of positive integers or None"),
        ({"ranking": "score"}, "ranking: expected one of ('attention', 'contribution'), got 'score'"),
        ({"distance": "l1"}, "distance: expected one of ('euclidean', 'cosine'), got 'l1'"),
        ({"key_mask": torch.ones(2, 5)}, "key_mask: expected a bool tensor"),
        ({"key_mask": torch.ones(2, 4, dtype=torch.bool)}, "key_mask: expected the shape of alpha (2, 5)"),
        ({"alpha": torch.ones(2, 5, dtype=torch.long)}, "alpha: expected a floating-point torch.Tensor"),
        ({"memory_budget_mib": 0}, "memory_budget_mib: expected a finite memory budget in MiB > 0"),
    ],
)
def test_bad_input_raises_geometry_error(kwargs, message):
    args = {"alpha": torch.full((2, 5), 0.2), "values": torch.ones(2, 5, 3), **kwargs}
    with pytest.raises(GeometryError) as info:
        selection_metrics(**args)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


# ---- rows that are not attention distributions


@given(st.integers(1, 6), st.integers(1, 40), st.floats(0.0, 3.0).filter(lambda t: abs(t - 1) > 0.011))
@example(1, 5, 5e-324)  # the row underflows to 0 (what CI once drew)
def test_rows_that_do_not_sum_to_one_are_refused(n_rows, n_keys, total):
    from tl_geometry.engine.inputs import ROW_SUM_TOLERANCE

    alpha = torch.softmax(torch.randn(n_rows, n_keys, dtype=torch.float64), -1)
    bad = n_rows // 2  # one row scaled away from 1, the others distributions
    alpha[bad] *= total
    with pytest.raises(GeometryError) as info:
        selection_metrics(alpha, torch.randn(n_rows, n_keys, 3, dtype=torch.float64))
    message = str(info.value)
    assert f"1 of {n_rows} rows do not sum to 1 over their visible keys (tolerance {ROW_SUM_TOLERANCE:g})" in message
    actual = float(alpha[bad].sum())  # not ``total``: a subnormal scale underflows the row to 0
    assert f"(row [{bad}]) sums to {actual:.6g}"[:20] in message and "check_sums=False" in message
    selection_metrics(alpha, torch.randn(n_rows, n_keys, 3, dtype=torch.float64), check_sums=False)  # on purpose


def test_row_sums_count_the_visible_keys_and_tolerate_bfloat16_rounding():
    g = torch.Generator().manual_seed(5)
    alpha, values = random_rows(g, (4,), 300, 8, dtype=torch.float32)
    selection_metrics(alpha.bfloat16().float(), values)  # rounded weights still sum to 1 within the tolerance
    causal = torch.ones(4, 300, dtype=torch.bool).tril(diagonal=296)
    renormalised = alpha * causal / (alpha * causal).sum(-1, keepdim=True)
    selection_metrics(renormalised, values, key_mask=causal)  # each row sums to 1 over what it sees
    with pytest.raises(GeometryError, match="rows do not sum to 1 over their visible keys"):
        selection_metrics(alpha, values, key_mask=torch.rand(4, 300, generator=g) < 0.5)  # half the mass hidden
    hidden = torch.zeros(4, 300, dtype=torch.bool)
    hidden[1:] = True
    selection_metrics(alpha * hidden, values, key_mask=hidden)  # a row with no visible key is left alone (NaN)


def window_mask(n_keys: int, window: int, queries: list[int]) -> torch.Tensor:
    """The keys each query sees through a sliding window, written from the rule q - W < k <= q, one key at a time."""
    return torch.tensor([[query - window < key <= query for key in range(n_keys)] for query in queries])


@given(
    n_keys=st.integers(2, 40),
    window=st.integers(1, 40),
    queries=st.lists(st.integers(0, 39), min_size=1, max_size=4),
    distance=st.sampled_from(["euclidean", "cosine"]),
    ranking=st.sampled_from(["attention", "contribution"]),
    seed=st.integers(0, 2**16),
)
@example(n_keys=40, window=3, queries=[39, 20], distance="euclidean", ranking="attention", seed=0)
@settings(max_examples=40, deadline=None)
def test_sliding_window_rows_match_the_reference(n_keys, window, queries, distance, ranking, seed):
    """Rows that see a window of a longer key axis (the metrics work on the ranks and N some row sees) against
    the reference over every key and every N, N beyond the window included (missing there)."""
    queries = [q % n_keys for q in queries]
    g = torch.Generator().manual_seed(seed)
    alpha, values = random_rows(g, (len(queries),), n_keys, 4)
    assert_matches_reference(alpha, values, None, window_mask(n_keys, window, queries), ranking, distance)
