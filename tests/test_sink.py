"""corr(R(r_min, N), rho_0) (paper section 4.1) against plain numpy loops, replicate bounds included."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures import simulate_study, true_means
from tests.reference import reference_disattenuated, reference_error_covariance, reference_shrunk
from tl_geometry import GeometryConfig, GeometryError, claims
from tl_geometry.analysis.sink import sink_recall_correlation
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.result import GeometryResult

RECALL = FieldSpec("recall", "R(r_min, N)", axes=("n",), bootstrap=True)
RHO0 = FieldSpec("rho0", "sink similarity", queries="sequence", bootstrap=True)


def make_result(recall: torch.Tensor, rho0: torch.Tensor | None, weights: torch.Tensor | None = None):
    """A GeometryResult over documents with the given recall [s, l, h, n], rho0 [s, l, h] and bootstrap weights [s, b]."""
    s, l, h, n = recall.shape
    weights = torch.zeros(s, 0) if weights is None else weights
    specs = [RECALL] if rho0 is None else [RECALL, RHO0]
    acc = Accumulator(specs, layers=range(l), heads=range(h), n_grid=torch.arange(1, n + 1),
                      n_bootstrap=weights.shape[1], replicate_fields=[spec.name for spec in specs])
    values = {"recall": recall.float()} if rho0 is None else {"recall": recall.float(), "rho0": rho0.float()}
    acc.add(values, weights.double(), n_tokens=10 * s)
    return GeometryResult.from_accumulator(acc, config=GeometryConfig(), model_name="fake")


def random_inputs(seed: int, s: int = 5, l: int = 3, h: int = 4, n: int = 6, b: int = 20, steps: bool = True):
    gen = torch.Generator().manual_seed(seed)
    rho0 = torch.rand(s, l, h, generator=gen) * 2 - 1
    # Recall loosely tied to rho0, NaN where N exceeds a short sequence; in steps of 1/N (many ties) unless
    # steps=False.
    noise = torch.rand(s, l, h, n, generator=gen)
    recall = (0.5 + 0.3 * rho0[..., None] + 0.4 * (noise - 0.5)).clamp(0, 1)
    if steps:
        recall = (recall * torch.arange(1, n + 1)).round() / torch.arange(1, n + 1)
    recall[0, ..., -2:] = math.nan
    weights = torch.poisson(torch.ones(s, b), generator=gen)
    return recall, rho0, weights


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


def weighted_mean(values: list[float], weights: list[float]) -> float:
    """sum w x / sum w over the defined values (NaN if they weigh nothing)."""
    pairs = [(v, w) for v, w in zip(values, weights) if not math.isnan(v)]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total > 0 else math.nan


def ref_pairs(recall: np.ndarray, rho0: np.ndarray, weights: list[float], n_index: int):
    """One pair per (layer, head): the weighted means over documents of R at one N and of rho_0."""
    x, y = [], []
    for l in range(recall.shape[1]):
        for h in range(recall.shape[2]):
            x.append(weighted_mean(list(recall[:, l, h, n_index]), weights))
            y.append(weighted_mean(list(rho0[:, l, h]), weights))
    return x, y


@pytest.mark.parametrize("steps", [True, False])
def test_correlations_and_bounds_match_the_reference(steps):
    recall, rho0, weights = random_inputs(0, steps=steps)
    got = sink_recall_correlation(make_result(recall, rho0, weights), confidence=0.9)
    r, p, w = recall.double().numpy(), rho0.double().numpy(), weights.double().numpy()
    s, n = recall.shape[0], recall.shape[-1]
    for k in range(n):
        pearson, spearman = ref_corr(*ref_pairs(r, p, [1.0] * s, k))  # per-head means: every weight 1
        assert math.isclose(got.pearson[k].item(), pearson, abs_tol=1e-5)
        assert math.isclose(got.spearman[k].item(), spearman, abs_tol=1e-5)
        boot = np.array([ref_corr(*ref_pairs(r, p, list(w[:, b]), k)) for b in range(w.shape[1])])
        low, high = np.nanquantile(boot, [0.05, 0.95], axis=0)  # each [pearson, spearman]
        assert math.isclose(got.pearson_low[k].item(), low[0], abs_tol=1e-5)
        assert math.isclose(got.pearson_high[k].item(), high[0], abs_tol=1e-5)
        if not steps:
            # Weighted means of values in steps of 1/N tie or nearly tie across heads, and rounding (float32
            # replicate sums here, float64 sums in another order there) decides their ranks: Spearman's
            # bounds are compared on continuous values.
            assert math.isclose(got.spearman_low[k].item(), low[1], abs_tol=1e-5)
            assert math.isclose(got.spearman_high[k].item(), high[1], abs_tol=1e-5)
    assert got.n_grid.tolist() == list(range(1, n + 1)) and got.n_bootstrap == 20 and got.over == "heads"
    assert got.n_pairs.tolist() == [12.0] * n


def test_the_disattenuated_correlation_matches_the_reference_and_the_claim():
    """At every N: Spearman's correction with the replicates' error (co)variances, and the basic interval on
    Fisher's z of the replicates' corrected correlations (in the shrunk bootstrap world) about the uncorrected
    value, from the definitions in numpy; at N = 3 it is the claims scorecard's value and interval."""
    result = simulate_study(true_means(), np.random.default_rng(11))
    got = sink_recall_correlation(result, confidence=0.9)
    n_docs = result.n_documents
    rho0 = result.per_head("rho0").double().numpy().ravel()
    ry = result.replicates("rho0").double().numpy().reshape(-1, rho0.size)
    z = lambda r: np.arctanh(np.clip(r, -1 + 1e-12, 1 - 1e-12))  # noqa: E731
    for k in range(len(result.n_grid)):
        x = result.per_head("recall")[..., k].double().numpy().ravel()
        rx = result.replicates("recall")[..., k].double().numpy().reshape(-1, x.size)
        noise = tuple(reference_error_covariance(a, b, n_docs) for a, b in ((rx, rx), (ry, ry), (rx, ry)))
        value = reference_disattenuated(x, rho0, *noise)
        reps = np.array([reference_disattenuated(a, b, *noise) for a, b in
                         zip(reference_shrunk(rx, x, noise[0]), reference_shrunk(ry, rho0, noise[1]))])
        low, high = np.quantile(z(reps) - z(np.corrcoef(x, rho0)[0, 1]), [0.05, 0.95])
        assert math.isclose(got.disattenuated[k].item(), value, abs_tol=1e-5)
        assert math.isclose(got.disattenuated_low[k].item(), np.tanh(z(value) - high), abs_tol=1e-5)
        assert math.isclose(got.disattenuated_high[k].item(), np.tanh(z(value) - low), abs_tol=1e-5)
    at = result.n_grid.tolist().index(3)
    row = claims(result).loc["sink_recall_correlation"]
    at95 = sink_recall_correlation(result)
    curve = (at95.disattenuated, at95.disattenuated_low, at95.disattenuated_high)
    assert (row.value, row.low, row.high) == pytest.approx(tuple(t[at].item() for t in curve), abs=1e-6)


def test_no_bounds_without_replicates_or_with_one_document():
    recall, rho0, weights = random_inputs(2, s=1)
    one = sink_recall_correlation(make_result(recall, rho0, weights))
    assert one.pearson_low.isnan().all() and one.spearman_high.isnan().all() and one.n_bootstrap == 0
    assert one.disattenuated.isnan().all() and one.disattenuated_high.isnan().all()
    assert not one.pearson[:4].isnan().any()
    recall, rho0, weights = random_inputs(2)
    bare = sink_recall_correlation(make_result(recall, rho0))
    assert bare.pearson_high.isnan().all() and bare.n_bootstrap == 0
    full = sink_recall_correlation(make_result(recall, rho0, weights))
    torch.testing.assert_close(bare.pearson, full.pearson, equal_nan=True)
    skipped = sink_recall_correlation(make_result(recall, rho0, weights), n_bootstrap=0)
    assert skipped.pearson_low.isnan().all() and skipped.n_bootstrap == 0
    same = sink_recall_correlation(make_result(recall, rho0, weights), n_bootstrap=20, seed=123)  # seed: ignored
    torch.testing.assert_close(same.pearson_low, full.pearson_low, equal_nan=True)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.1, 10.0), st.floats(-1, 1))
def test_invariances(seed, scale, shift):
    """Pearson is unchanged by an affine map of rho_0 (means commute with it), Spearman by any increasing
    one when each head's mean is one document's value; both lie in [-1, 1]."""
    recall, rho0, _ = random_inputs(seed, s=3)
    base = sink_recall_correlation(make_result(recall, rho0))
    affine = sink_recall_correlation(make_result(recall, scale * rho0 + shift))
    torch.testing.assert_close(affine.pearson, base.pearson, equal_nan=True, atol=1e-4, rtol=0)
    one = sink_recall_correlation(make_result(recall[:1], rho0[:1]))
    monotone = sink_recall_correlation(make_result(recall[:1], torch.exp(3 * rho0[:1])))
    torch.testing.assert_close(monotone.spearman, one.spearman, equal_nan=True, atol=1e-5, rtol=0)
    defined = base.pearson[~base.pearson.isnan()]
    assert (defined.abs() <= 1).all()


def test_bad_input_is_refused():
    recall, rho0, weights = random_inputs(0)
    with pytest.raises(GeometryError, match="no 'rho0' field; run run_with_geometry_hooks"):
        sink_recall_correlation(make_result(recall, None))
    with pytest.raises(GeometryError, match="over='sequence_heads' needs each document's values"):
        sink_recall_correlation(make_result(recall, rho0), over="sequence_heads")
    with pytest.raises(GeometryError, match="over: expected 'heads', got 'layers'"):
        sink_recall_correlation(make_result(recall, rho0), over="layers")
    with pytest.raises(GeometryError, match="confidence: expected a level in \\(0, 1\\)"):
        sink_recall_correlation(make_result(recall, rho0), confidence=95.0)
    with pytest.raises(GeometryError, match="n_bootstrap: the bounds use the result's 20 bootstrap replicates"):
        sink_recall_correlation(make_result(recall, rho0, weights), n_bootstrap=1000)
    with pytest.raises(GeometryError, match="this result has no attention-profile fit"):
        make_result(recall, rho0).profile_fit


@settings(max_examples=100, deadline=None)
@given(inside=st.lists(st.floats(-0.999, 0.999), min_size=1, max_size=20),
       over=st.lists(st.sampled_from([1.0, -1.0]), max_size=5))
def test_a_replicate_corrected_to_one_counts_as_the_most_extreme_inside(inside, over):
    """Fisher's z of the replicates inside (-1, 1); one corrected to +-1 takes the largest (smallest) of those
    z, so that the bounds stay finite and within the replicates' own range."""
    from tl_geometry.analysis.correlation import replicate_z

    r = np.array(inside + over)
    z = np.arctanh(np.array(inside))
    want = np.concatenate([z, [z.max() if x > 0 else z.min() for x in over]])
    assert np.allclose(replicate_z(torch.tensor(r)).numpy(), want, atol=1e-12)
