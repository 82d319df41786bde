"""Invariants of the selection metrics, for inputs drawn by hypothesis.

The weights drawn are any non-negative numbers (the invariants hold whether or not a row sums to 1), so the
calls pass ``check_sums=False``; the row-sum check has its own tests.
"""

import math

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.reference import reference_metrics
from tl_geometry import selection_metrics
from tl_geometry.engine.metrics import extreme_with_place

FLOATS = st.floats(min_value=-4.0, max_value=4.0, allow_nan=False, width=64)
# Away from zero, values keep a dynamic range the float64 reference can resolve:
# with weights like 1e-309 it rounds s - y_i to s and miscounts (the engine,
# which never forms s - y_i for the counts, is right; see exact_counts).
MODERATE_FLOATS = st.one_of(st.just(0.0), st.floats(1e-2, 4.0), st.floats(-4.0, -1e-2))
MODERATE_WEIGHTS = st.one_of(st.just(0.0), st.floats(1e-4, 1.0))


@st.composite
def rows(draw, max_rows=3, max_keys=9, max_d=4, distinct_weights=False, moderate=False):
    """alpha [rows, key] >= 0, values [rows, key, d], and a key mask with >= 1 visible key per row."""
    n_rows = draw(st.integers(1, max_rows))
    n_keys = draw(st.integers(1, max_keys))
    d_head = draw(st.integers(1, max_d))
    floats = MODERATE_FLOATS if moderate else FLOATS
    weights = MODERATE_WEIGHTS if moderate else st.floats(min_value=0.0, max_value=1.0, allow_nan=False, width=64)
    if distinct_weights:
        alpha = [draw(st.lists(weights, min_size=n_keys, max_size=n_keys, unique=True)) for _ in range(n_rows)]
    else:
        alpha = draw(st.lists(st.lists(weights, min_size=n_keys, max_size=n_keys), min_size=n_rows, max_size=n_rows))
    values = draw(
        st.lists(
            st.lists(st.lists(floats, min_size=d_head, max_size=d_head), min_size=n_keys, max_size=n_keys),
            min_size=n_rows,
            max_size=n_rows,
        )
    )
    mask = draw(st.lists(st.lists(st.booleans(), min_size=n_keys, max_size=n_keys), min_size=n_rows, max_size=n_rows))
    mask = torch.tensor(mask, dtype=torch.bool)
    mask[:, 0] |= ~mask.any(-1)  # every row sees at least one key
    return torch.tensor(alpha, dtype=torch.float64), torch.tensor(values, dtype=torch.float64), mask


METRICS = st.sampled_from(["attention", "contribution"]), st.sampled_from(["euclidean", "cosine"])


@settings(max_examples=150, deadline=None)
@given(rows(), *METRICS)
def test_precision_and_recall_lie_in_zero_one(inputs, ranking, distance):
    alpha, values, mask = inputs
    m = selection_metrics(alpha, values, key_mask=mask, ranking=ranking, distance=distance, check_sums=False)
    defined = ~torch.isnan(m.precision)
    assert (m.precision[defined] > 0).all() and (m.precision[defined] <= 1).all()
    assert (m.recall[defined] >= 0).all() and (m.recall[defined] <= 1).all()
    assert (m.f_rmax[defined] <= 1).all() and (m.f_rmin[defined] <= 1).all()


@settings(max_examples=150, deadline=None)
@given(rows(), *METRICS)
def test_nan_exactly_where_n_exceeds_the_visible_keys_and_one_at_all_keys(inputs, ranking, distance):
    alpha, values, mask = inputs
    grid = list(range(1, alpha.shape[-1] + 2))
    m = selection_metrics(alpha, values, grid, key_mask=mask, ranking=ranking, distance=distance, check_sums=False)
    visible = mask.sum(-1, keepdim=True)
    for field in m.per_row_fields().values():
        assert torch.equal(torch.isnan(field), m.n_grid > visible)
    everything = m.n_grid == visible
    assert (m.precision[everything] == 1).all() and (m.recall[everything] == 1).all()
    assert (m.f_score[everything] == 1).all()


@settings(max_examples=150, deadline=None)
@given(rows())
def test_f_is_one_at_n_one_without_duplicate_vectors(inputs):
    alpha, values, mask = inputs
    y = alpha.unsqueeze(-1) * values
    for r in range(alpha.shape[0]):
        vis = y[r][mask[r]]
        gaps = torch.cdist(vis, vis) + torch.eye(len(vis)) * math.inf
        assume(len(vis) < 2 or gaps.min() > 1e-9)
    m = selection_metrics(alpha, values, [1], key_mask=mask, check_sums=False)
    assert (m.f_score == 1).all() and (m.f_rmin == 1).all() and (m.f_rmax == 1).all()


@settings(max_examples=150, deadline=None)
@given(rows(distinct_weights=True), *METRICS, st.data())
def test_permuting_keys_changes_nothing(inputs, ranking, distance, data):
    alpha, values, mask = inputs
    if ranking == "contribution":
        score = alpha * values.norm(dim=-1)
        for r in range(alpha.shape[0]):
            assume(len(set(score[r][mask[r]].tolist())) == int(mask[r].sum()))
    perm = torch.tensor(data.draw(st.permutations(range(alpha.shape[-1]))))
    base = selection_metrics(alpha, values, key_mask=mask, ranking=ranking, distance=distance, check_sums=False)
    moved = selection_metrics(
        alpha[:, perm], values[:, perm], key_mask=mask[:, perm], ranking=ranking, distance=distance, check_sums=False
    )
    for name, tensor in base.per_row_fields().items():
        torch.testing.assert_close(getattr(moved, name), tensor, equal_nan=True, msg=name)


@settings(max_examples=150, deadline=None)
@given(rows(), st.sampled_from(["attention", "contribution"]), st.integers(-12, 12))
def test_counts_do_not_change_when_values_scale(inputs, ranking, exponent):
    # Powers of two scale every float exactly, so even exact ties survive.
    # Euclidean only: the cosine distance's fixed 1e-12 guard is not scale-free.
    alpha, values, mask = inputs
    distance, scale = "euclidean", 2.0**exponent
    y = (alpha.unsqueeze(-1) * values).abs()
    # Squares stay clear of float64 underflow at every scale, and no product of two nonzero factors underflows
    # to 0 (a subnormal alpha times 0.5 is 0, times 1.0 is not: scaling would change the ties).
    factors = (alpha.unsqueeze(-1) != 0) & (values != 0)
    assume((y[factors] > 1e-140).all())
    base = selection_metrics(alpha, values, key_mask=mask, ranking=ranking, distance=distance, check_sums=False)
    scaled = selection_metrics(alpha, values * scale, key_mask=mask, ranking=ranking, distance=distance, check_sums=False)
    for name in ("k_in", "k_out", "precision", "recall"):
        assert torch.equal(getattr(scaled, name).nan_to_num(-1), getattr(base, name).nan_to_num(-1)), name
    torch.testing.assert_close(scaled.r_max, base.r_max * scale, equal_nan=True)


@settings(max_examples=60, deadline=None)
@given(rows(max_keys=7, moderate=True), *METRICS)
def test_matches_the_reference_on_arbitrary_inputs(inputs, ranking, distance):
    alpha, values, mask = inputs
    fast = selection_metrics(alpha, values, key_mask=mask, ranking=ranking, distance=distance, check_sums=False)
    ref = reference_metrics(alpha, values, fast.n_grid.tolist(), mask, ranking, distance)
    for name in ("k_in", "k_out"):
        assert torch.equal(getattr(fast, name).nan_to_num(-1), ref[name].nan_to_num(-1)), name


@given(
    n_keys=st.integers(1, 700),
    n_levels=st.integers(1, 6),
    largest=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=60, deadline=None)
def test_extreme_with_place_is_the_first_place_of_the_extreme(n_keys, n_levels, largest, seed):
    """The blocked search equals a plain scan: the extreme, and the first key holding it (few levels: many ties;
    +-inf as values; key counts on both sides of whole blocks)."""
    gen = torch.Generator().manual_seed(seed)
    levels = torch.tensor([-math.inf, math.inf, *range(n_levels)], dtype=torch.float32)
    x = levels[torch.randint(len(levels), (3, 2, n_keys), generator=gen)]
    value, place = extreme_with_place(x, largest)
    rows = x.reshape(-1, n_keys).tolist()
    for row, got_value, got_place in zip(rows, value.flatten().tolist(), place.flatten().tolist()):
        best = max(row) if largest else min(row)
        assert got_value == best and got_place == row.index(best)
