"""The upper bounds drawn against the measurement, and what the theorem's upper envelopes bound.

The theorem's upper envelopes (eq. 13, 15) plug each row's realised gaps
into a Gaussian tail: they bound the mean of rows re-drawn around the
measured one, and a measured row with no intruder lies above them. The
realised bounds P <= 1 - 1{r_min <= r_max}/(N+1), R <= 1 - 1{r_min <= r_max}/N
bound the measured row itself. References here are written from those
definitions (distances computed directly), never with the package's helpers.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import tiny_models as tm
from tests.mutants import Mutant, assert_caught, replace_attribute
from tl_geometry.capture.hooks import run_with_geometry_hooks
from tl_geometry.theory import theorem_bounds as BOUNDS
from tl_geometry.theory.theorem_bounds import envelopes, realised_upper_bounds, selection_margins, upper_envelope_floor


def slow_row(alpha: torch.Tensor, values: torch.Tensor, n: int) -> dict[str, float]:
    """P, R, r_min, r_max and the realised bounds of one row at one N, from the definitions (float64)."""
    alpha, values = alpha.double(), values.double()
    keys = sorted(range(len(alpha)), key=lambda i: (-float(alpha[i]), i))
    selected, rest = keys[:n], keys[n:]
    y = {i: alpha[i] * values[i] for i in keys}
    s = sum((y[i] for i in selected), torch.zeros(values.shape[-1], dtype=torch.float64))
    dist = {i: float((s - y[i]).norm()) for i in keys}
    r_max = max(dist[i] for i in selected)
    r_min = min((dist[j] for j in rest), default=math.inf)
    k_out = sum(dist[j] <= r_max for j in rest)
    k_in = sum(dist[i] < r_min for i in selected)
    swapped = r_min <= r_max
    return {
        "precision": n / (n + k_out),
        "recall": k_in / n,
        "p_bound": n / (n + 1) if swapped else 1.0,
        "r_bound": (n - 1) / n if swapped else 1.0,
    }


def _row(seed: int, keys: int, d: int, ties: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    alpha = torch.rand(keys, generator=g, dtype=torch.float64) ** 3
    alpha[0] += 1.0  # a sink
    alpha = alpha / alpha.sum()
    values = torch.randn(keys, d, generator=g, dtype=torch.float64)
    if ties and keys > 2:  # repeated tokens: identical value vectors (and weights), the case where ties decide
        values[2] = values[1]
        alpha[2] = alpha[1]
    return alpha, values


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), keys=st.integers(2, 12), d=st.integers(1, 6), ties=st.booleans())
def test_realised_bounds_match_the_slow_reference_and_are_never_exceeded(seed, keys, d, ties):
    alpha, values = _row(seed, keys, d, ties)
    grid = list(range(1, keys + 1))
    ref = [slow_row(alpha, values, n) for n in grid]
    swapped = torch.tensor([r["p_bound"] < 1 for r in ref])
    p_up, r_up = BOUNDS.realised_upper_bounds(swapped, torch.tensor(grid), torch.float64)  # as the mutants patch it
    for i, r in enumerate(ref):
        assert float(p_up[i]) == pytest.approx(r["p_bound"], abs=1e-12)
        assert float(r_up[i]) == pytest.approx(r["r_bound"], abs=1e-12)
        assert r["precision"] <= float(p_up[i]) + 1e-12
        assert r["recall"] <= float(r_up[i]) + 1e-12


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), keys=st.integers(3, 12), d=st.integers(1, 6), kappa=st.sampled_from([1.0, 1e3, 1e6]),
       variant=st.sampled_from(["sink_aware", "paper"]))
def test_the_theorem_upper_envelopes_never_fall_below_their_floor(seed, keys, d, kappa, variant):
    """Whatever the data, P_up >= 1 - 1/2 / (N + 1) and R_up >= 1/2 (p_- <= 1/2): the floor, written from eq. 9."""
    alpha, values = _row(seed, keys, d, False)
    grid = torch.arange(1, keys + 1)
    e = envelopes(selection_margins(alpha, values, grid), d_head=d, kappa=kappa, variant=variant)
    p_floor, r_floor = upper_envelope_floor(grid)
    for i, n in enumerate(grid.tolist()):
        want_p = 1.0 if n == 1 else 1 - 0.5 / (n + 1)
        want_r = 1.0 if n == 1 else 0.5
        assert float(p_floor[i]) == pytest.approx(want_p) and float(r_floor[i]) == pytest.approx(want_r)
        assert float(e.precision_upper[i]) >= want_p - 1e-12
        assert float(e.recall_upper[i]) >= want_r - 1e-12


def test_a_row_without_intruder_lies_above_the_theorem_envelope_but_not_the_realised_bound():
    """The reviewer's case: P = 1 with a gap small enough for p_- > 0: the envelope (a re-drawn row's) is exceeded."""
    alpha = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    values = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.25, 0.0]], dtype=torch.float64)  # D: 0.3, 0.5 | 0.55
    ref = slow_row(alpha, values, 2)
    assert ref["precision"] == 1.0
    e = envelopes(selection_margins(alpha, values, [2]), d_head=2, kappa=1000.0)
    assert float(e.precision_upper[0]) < 1.0  # the theorem's envelope sits below the measured row
    p_up, _ = realised_upper_bounds(torch.tensor([ref["p_bound"] < 1]), torch.tensor([2]), torch.float64)
    assert float(p_up[0]) == 1.0


def test_in_float32_the_bound_is_never_one_rounding_below_the_metric():
    """One intruder gives P = N / (N + 1) exactly as the metrics compute it: the bound must equal it bit for bit
    (1 - 1/(N+1) in float32 is 1 ulp lower for N = 5, 6, ...; the real model's rows found it)."""
    grid = torch.arange(1, 200)
    p_up, r_up = BOUNDS.realised_upper_bounds(torch.ones(len(grid), dtype=torch.bool), grid, torch.float32)
    n = grid.to(torch.float32)
    assert bool((n / (n + 1) <= p_up).all()) and bool(((n - 1) / n <= r_up).all())


@pytest.mark.model
def test_the_diagnostic_realised_bounds_hold_on_every_row_and_count_the_exceedances():
    """Every analysed row: the realised bounds equal the slow reference and are never exceeded (0 cells); the
    exceedance field is 1 exactly where the measured metric lies above the theorem's upper envelope."""
    model = tm.make_model("bridge-llama", dtype=torch.float64)
    tokens = tm.with_bos(tm.random_tokens(2, 12))
    grid = [1, 2, 3, 4, 8, 13]
    result = run_with_geometry_hooks(model, tokens, diagnostics=["bounds"], n_grid=grid, keep_queries=True,
                                     query_positions=[5, 9, 12], capture="pattern")
    q = result.queries
    ok = ~q["precision"].isnan()
    assert int(ok.sum()) > 0
    for metric in ("precision", "recall"):
        bound = q[f"bound_{metric}_realised"]
        assert int((q[metric][ok] > bound[ok]).sum()) == 0
        above = (q[metric] > q[f"bound_{metric}_upper"]).double()
        torch.testing.assert_close(q[f"bound_{metric}_upper_exceeded"][ok], above[ok])
    # The reference, row by row, from the model's own attention and values.
    from tl_geometry.capture.hook_names import pattern_hook, value_hook

    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in (value_hook(1), pattern_hook(1)))
    pattern, v = cache[pattern_hook(1)].double(), cache[value_hook(1)].double()
    group = pattern.shape[1] // v.shape[2]
    for b in range(2):
        for head in range(pattern.shape[1]):
            for qi, pos in enumerate([5, 9, 12]):
                alpha, values = pattern[b, head, pos, : pos + 1], v[b, : pos + 1, head // group]
                for col, n in enumerate(grid):
                    got = float(q["bound_precision_realised"][b, 1, head, qi, col])
                    if n > pos + 1:
                        assert math.isnan(got)
                        continue
                    ref = slow_row(alpha, values, n)
                    assert got == pytest.approx(ref["p_bound"], abs=1e-9)
                    assert float(q["bound_recall_realised"][b, 1, head, qi, col]) == pytest.approx(ref["r_bound"], abs=1e-9)
    # The means over documents inherit the bound.
    for metric in ("precision", "recall"):
        assert bool((result.per_head(metric) <= result.per_head(f"bound_{metric}_realised") + 1e-12).all())


# --- Mutants: each must be caught by the reference test above ----------------------------------------------------------


def _stand_in(precision, recall):
    """A realised_upper_bounds with other arithmetic: ``precision(n, hit)`` and ``recall(n, hit)``."""
    def realised_upper_bounds(swapped, n_grid, dtype=torch.float32):
        n, hit = n_grid.to(dtype), swapped.to(dtype)
        return precision(n, hit), recall(n, hit)
    return replace_attribute(BOUNDS, "realised_upper_bounds", realised_upper_bounds)


def _matches_the_reference():
    test_realised_bounds_match_the_slow_reference_and_are_never_exceeded.hypothesis.inner_test(
        seed=3, keys=8, d=2, ties=True)


REALISED_MUTANTS = [
    Mutant("a looser P bound", _stand_in(lambda n, hit: n / (n + hit / 2), lambda n, hit: (n - hit) / n),
           (_matches_the_reference,)),
    Mutant("a looser R bound", _stand_in(lambda n, hit: n / (n + hit), lambda n, hit: (n - hit / 2) / n),
           (_matches_the_reference,)),
    Mutant("too tight: exceeded", _stand_in(lambda n, hit: (n - hit) / n, lambda n, hit: (n - hit) / n),
           (_matches_the_reference,)),
    Mutant("rounds below P in float32", _stand_in(lambda n, hit: 1 - hit / (n + 1), lambda n, hit: 1 - hit / n),
           (test_in_float32_the_bound_is_never_one_rounding_below_the_metric,)),
]


@pytest.mark.parametrize("mutant", REALISED_MUTANTS, ids=lambda mutant: mutant.name.replace(" ", "-"))
def test_mutants_of_the_realised_bounds_are_caught(mutant):
    assert_caught(mutant)
