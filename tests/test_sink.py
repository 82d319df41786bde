"""corr(R(r_min, N), rho_0) (paper section 4.1) against plain numpy loops, bootstrap included."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_geometry import GeometryConfig, GeometryError
from tl_geometry.results.result import REQUIRED_FIELDS, result_from_parts
from tl_geometry.analysis.sink import sink_recall_correlation


def make_result(recall: torch.Tensor, rho0: torch.Tensor | None):
    """A GeometryResult with the given recall [s, l, h, n] and rho0 [s, l, h] (other metrics zero)."""
    s, l, h, n = recall.shape
    per_sequence = {name: torch.zeros(s, l, h, n) for name in REQUIRED_FIELDS}
    per_sequence["recall"] = recall.float()
    if rho0 is not None:
        per_sequence["rho0"] = rho0.float()
    return result_from_parts(
        per_sequence, n_grid=torch.arange(1, n + 1), layers=tuple(range(l)), heads=tuple(range(h)),
        sequence_lengths=torch.full((s,), 10), config=GeometryConfig(), model_name="fake",
    )


def random_inputs(seed: int, s: int = 5, l: int = 3, h: int = 4, n: int = 6):
    gen = torch.Generator().manual_seed(seed)
    rho0 = torch.rand(s, l, h, generator=gen) * 2 - 1
    # Recall in steps of 1/N (many ties), loosely tied to rho0, NaN where N exceeds a short sequence.
    noise = torch.rand(s, l, h, n, generator=gen)
    recall = ((0.5 + 0.3 * rho0[..., None] + 0.4 * (noise - 0.5)).clamp(0, 1) * torch.arange(1, n + 1)).round()
    recall = recall / torch.arange(1, n + 1)
    recall[0, ..., -2:] = math.nan
    return recall, rho0


def ref_ranks(x: list[float]) -> list[float]:
    """Average ranks, 1-based, ties sharing the mean of their positions."""
    ordered = sorted(x)
    return [sum(i + 1 for i, y in enumerate(ordered) if y == v) / ordered.count(v) for v in x]


def ref_corr(x: list[float], y: list[float]) -> tuple[float, float]:
    keep = [(a, b) for a, b in zip(x, y) if not (math.isnan(a) or math.isnan(b))]
    xs, ys = [a for a, _ in keep], [b for _, b in keep]
    if len(keep) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return math.nan, math.nan
    return float(np.corrcoef(xs, ys)[0, 1]), float(np.corrcoef(ref_ranks(xs), ref_ranks(ys))[0, 1])


def ref_pairs(recall: np.ndarray, rho0: np.ndarray, sequences: list[int], over: str, n_index: int):
    """The pairs of one N for the given (possibly repeated) sequences."""
    if over == "sequence_heads":
        return [float(recall[s, l, h, n_index]) for s in sequences for l in range(recall.shape[1]) for h in range(recall.shape[2])], [
            float(rho0[s, l, h]) for s in sequences for l in range(recall.shape[1]) for h in range(recall.shape[2])
        ]
    x, y = [], []
    for l in range(recall.shape[1]):
        for h in range(recall.shape[2]):
            r = [recall[s, l, h, n_index] for s in sequences if not math.isnan(recall[s, l, h, n_index])]
            x.append(float(np.mean(r)) if r else math.nan)
            y.append(float(np.mean([rho0[s, l, h] for s in sequences])))
    return x, y


@pytest.mark.parametrize("over", ["heads", "sequence_heads"])
def test_correlations_and_bootstrap_match_the_reference(over):
    recall, rho0 = random_inputs(0)
    result = make_result(recall, rho0)
    got = sink_recall_correlation(result, over=over, n_bootstrap=20, seed=3)
    r, p = recall.double().numpy(), rho0.double().numpy()
    s, n = recall.shape[0], recall.shape[-1]
    draws = torch.randint(0, s, (20, s), generator=torch.Generator().manual_seed(3)).tolist()
    for k in range(n):
        pearson, spearman = ref_corr(*ref_pairs(r, p, list(range(s)), over, k))
        assert math.isclose(got.pearson[k].item(), pearson, abs_tol=1e-5)
        assert math.isclose(got.spearman[k].item(), spearman, abs_tol=1e-5)
        boot = np.array([ref_corr(*ref_pairs(r, p, d, over, k)) for d in draws])
        low, high = np.nanquantile(boot, [0.025, 0.975], axis=0)  # each [pearson, spearman]
        assert math.isclose(got.pearson_low[k].item(), low[0], abs_tol=1e-5)
        assert math.isclose(got.pearson_high[k].item(), high[0], abs_tol=1e-5)
        assert math.isclose(got.spearman_low[k].item(), low[1], abs_tol=1e-5)
        assert math.isclose(got.spearman_high[k].item(), high[1], abs_tol=1e-5)
    assert got.n_grid.tolist() == list(range(1, n + 1))


def test_the_result_property_is_the_pearson_value():
    recall, rho0 = random_inputs(1)
    result = make_result(recall, rho0)
    torch.testing.assert_close(result.sink_recall_corr, sink_recall_correlation(result).pearson)


def test_one_sequence_has_no_bootstrap_bounds_and_a_seed_repeats():
    recall, rho0 = random_inputs(2, s=1)
    one = sink_recall_correlation(make_result(recall, rho0))
    assert one.pearson_low.isnan().all() and one.spearman_high.isnan().all()
    assert not one.pearson[:4].isnan().any()
    recall, rho0 = random_inputs(2)
    a = sink_recall_correlation(make_result(recall, rho0), n_bootstrap=30, seed=7)
    b = sink_recall_correlation(make_result(recall, rho0), n_bootstrap=30, seed=7)
    assert torch.equal(a.pearson_low, b.pearson_low)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.1, 10.0), st.floats(-1, 1))
def test_invariances(seed, scale, shift):
    """Pearson is unchanged by an affine map of rho_0, Spearman by any increasing one; both lie in [-1, 1]."""
    recall, rho0 = random_inputs(seed, s=3)
    base = sink_recall_correlation(make_result(recall, rho0), n_bootstrap=1)
    affine = sink_recall_correlation(make_result(recall, scale * rho0 + shift), n_bootstrap=1)
    torch.testing.assert_close(affine.pearson, base.pearson, equal_nan=True, atol=1e-4, rtol=0)
    # Per-head means over sequences are not preserved by a nonlinear map: check per (sequence, head) pairs.
    base = sink_recall_correlation(make_result(recall, rho0), over="sequence_heads", n_bootstrap=1)
    monotone = sink_recall_correlation(make_result(recall, torch.exp(3 * rho0)), over="sequence_heads", n_bootstrap=1)
    torch.testing.assert_close(monotone.spearman, base.spearman, equal_nan=True, atol=1e-5, rtol=0)
    defined = base.pearson[~base.pearson.isnan()]
    assert (defined.abs() <= 1).all()


def test_bad_input_is_refused():
    recall, rho0 = random_inputs(0)
    with pytest.raises(GeometryError, match="no 'rho0' field; run run_with_geometry_hooks"):
        sink_recall_correlation(make_result(recall, None))
    with pytest.raises(GeometryError, match="over: expected 'heads' or 'sequence_heads', got 'layers'"):
        sink_recall_correlation(make_result(recall, rho0), over="layers")
    with pytest.raises(GeometryError, match="confidence: expected a level in \\(0, 1\\)"):
        sink_recall_correlation(make_result(recall, rho0), confidence=95.0)
    with pytest.raises(GeometryError, match="this result has no attention-profile fit"):
        make_result(recall, rho0).profile_fit
