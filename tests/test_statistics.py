"""Assumption diagnostics (paper sections 3.1-3.3) against float64 loops written from the definitions."""

import math
import statistics as pystats

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import tiny_models as tm
from tests.fixtures import spy
from tl_geometry import GeometryError, run_with_geometry_hooks, sink_recall_correlation
from tl_geometry.capture.hook_names import pattern_hook, value_hook
from tl_geometry.diagnostics import assumptions
from tl_geometry.diagnostics.assumptions import (
    DIAGNOSTIC,
    MAX_LAG_FIT,
    cosine_by_lag,
    fit_exponential_decay,
    sink_similarity,
    value_norm_statistics,
)
from tl_geometry.engine.context import SelectionContext

# ---- float64 references, one row (one head of one sequence) at a time ----


def ref_norm_stats(v: np.ndarray) -> tuple[list[float], float, float]:
    """v: [length, d] of real positions only. Norms, CV (population std / mean of i > 0), lambda."""
    norms = [math.sqrt(sum(float(x) ** 2 for x in row)) for row in v]
    rest = norms[1:]
    cv = pystats.pstdev(rest) / pystats.fmean(rest) if len(rest) >= 2 else math.nan
    return norms, cv, norms[0] / pystats.median(rest)


def ref_cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def ref_lag_profile(v: np.ndarray, n_pos: int) -> list[float]:
    """Mean cos(v_i, v_j) over all pairs i, j > 0 with |i - j| = lag, lags 0..n_pos-1 (NaN: no pair)."""
    out = []
    for lag in range(n_pos):
        pairs = [ref_cos(v[i], v[i + lag]) for i in range(1, len(v) - lag)]
        out.append(sum(pairs) / len(pairs) if pairs else math.nan)
    return out


def ref_rho0(v: np.ndarray) -> float:
    return sum(ref_cos(v[0], v[j]) for j in range(1, len(v))) / (len(v) - 1)


def padded(rows: list[np.ndarray], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    d = rows[0].shape[1]
    values = torch.zeros(len(rows), width, d, dtype=torch.float64)
    real = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        values[i, : len(r)] = torch.from_numpy(r)
        real[i, : len(r)] = True
    return values, real


def random_rows(seed: int, lengths: list[int], d: int = 8) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # A shared offset makes cosines positive and lag-dependent on average, like real value states.
    return [rng.normal(size=(n, d)) + rng.normal(size=d) for n in lengths]


# ---- the pure functions ----


@pytest.mark.parametrize("lengths", [[12, 12], [9, 5, 2, 3]])
def test_norm_statistics_match_the_reference(lengths):
    rows = random_rows(0, lengths)
    values, real = padded(rows, max(lengths))
    norms, cv, ratio = value_norm_statistics(values, real)
    for i, row in enumerate(rows):
        ref_norms, ref_cv, ref_ratio = ref_norm_stats(row)
        torch.testing.assert_close(norms[i, : len(row)], torch.tensor(ref_norms, dtype=torch.float64))
        assert norms[i, len(row) :].isnan().all()
        assert (math.isnan(ref_cv) and cv[i].isnan()) or math.isclose(cv[i].item(), ref_cv, rel_tol=1e-9)
        assert math.isclose(ratio[i].item(), ref_ratio, rel_tol=1e-9)


def test_norm_statistics_of_constant_norms_and_a_compressed_sink():
    rng = np.random.default_rng(1)
    v = rng.normal(size=(20, 16))
    v = 3.0 * v / np.linalg.norm(v, axis=1, keepdims=True)
    v[0] *= 0.1  # lambda = 0.1, C = 3: Assumption 1 exactly
    _, cv, ratio = value_norm_statistics(torch.from_numpy(v), torch.ones(20, dtype=torch.bool))
    assert cv.item() < 1e-12 and math.isclose(ratio.item(), 0.1, rel_tol=1e-12)


@pytest.mark.parametrize("lengths", [[16, 16], [16, 7, 3, 2]])
def test_cosine_by_lag_and_rho0_match_the_reference(lengths):
    rows = random_rows(2, lengths)
    width = max(lengths)
    values, real = padded(rows, width)
    profile = cosine_by_lag(values, real)
    rho0 = sink_similarity(values, real)
    assert profile.shape == (len(rows), width)
    for i, row in enumerate(rows):
        expected = torch.tensor(ref_lag_profile(row, width), dtype=torch.float32)
        torch.testing.assert_close(profile[i], expected, equal_nan=True, atol=1e-6, rtol=1e-5)
        assert math.isclose(rho0[i].item(), ref_rho0(row), rel_tol=1e-9, abs_tol=1e-12)


def test_cosine_by_lag_is_accurate_at_the_context_length_in_float32():
    rng = np.random.default_rng(3)
    v = rng.normal(size=(300, 16)) + 0.7 * rng.normal(size=16)
    profile = cosine_by_lag(torch.from_numpy(v).float(), torch.ones(300, dtype=torch.bool))
    expected = torch.tensor(ref_lag_profile(v, 300), dtype=torch.float32)
    torch.testing.assert_close(profile, expected, equal_nan=True, atol=5e-5, rtol=0)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 24), st.integers(1, 6), st.integers(0, 10_000))
def test_lag_profile_invariants(length, d, seed):
    """Lag 0 is 1, every mean cosine lies in [-1, 1], a row's scale does not matter, padding does not leak."""
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(length, d, generator=gen, dtype=torch.float64)
    real = torch.ones(length, dtype=torch.bool)
    profile = cosine_by_lag(v, real)
    defined = profile[~profile.isnan()]
    if length >= 2:
        assert math.isclose(profile[0].item(), 1.0, abs_tol=1e-6)
    assert (defined.abs() <= 1 + 1e-6).all()
    assert profile[length - 1 :].isnan().all()  # lag >= number of non-sink positions: no pair
    scaled = cosine_by_lag(v * torch.linspace(0.5, 3, length, dtype=torch.float64)[:, None], real)
    torch.testing.assert_close(scaled, profile, equal_nan=True, atol=1e-6, rtol=0)
    more = torch.cat([v, torch.randn(3, d, generator=gen, dtype=torch.float64)])
    with_padding = cosine_by_lag(more, torch.cat([real, torch.zeros(3, dtype=torch.bool)]))
    torch.testing.assert_close(with_padding[:length], profile, equal_nan=True, atol=1e-6, rtol=0)


@pytest.mark.parametrize("beta", [0.005, 0.03, 0.1, 0.5, 2.0])
def test_decay_fit_recovers_beta_exactly(beta):
    lags = torch.arange(200, dtype=torch.float64)
    fitted, mae = fit_exponential_decay(torch.exp(-beta * lags))
    assert abs(fitted.item() - beta) / beta < 2e-3 and mae.item() < 2e-3


@pytest.mark.parametrize("beta", [0.01, 0.05, 0.2])
def test_decay_fit_recovers_beta_with_noise(beta):
    gen = torch.Generator().manual_seed(4)
    lags = torch.arange(200, dtype=torch.float64)
    noisy = torch.exp(-beta * lags) + 0.02 * torch.randn(50, 200, generator=gen, dtype=torch.float64)
    fitted, mae = fit_exponential_decay(noisy)
    assert fitted.shape == (50,)
    assert (fitted - beta).abs().median() / beta < 0.1
    assert (mae - 0.016).abs().max() < 0.006  # E|N(0, 0.02)| = 0.016: the fit leaves only the noise


def test_decay_fit_uses_only_lags_up_to_max_lag_and_handles_negative_cosines():
    lags = torch.arange(300, dtype=torch.float64)
    profile = torch.exp(-0.1 * lags)
    profile[MAX_LAG_FIT + 1 :] = -0.5  # beyond the fitted lags: ignored
    beta, mae = fit_exponential_decay(profile)
    assert abs(beta.item() - 0.1) < 2e-4 and mae.item() < 1e-3
    beta, _ = fit_exponential_decay(torch.full((10,), -0.3))  # anti-correlated: the fastest decay allowed
    assert beta.item() == pytest.approx(10.0)
    beta, mae = fit_exponential_decay(torch.tensor([1.0, math.nan, math.nan]))
    assert beta.isnan() and mae.isnan()


def test_pure_functions_refuse_bad_input():
    with pytest.raises(GeometryError, match="position 0 \\(the sink\\) must be a real token"):
        value_norm_statistics(torch.ones(2, 4, 3), torch.tensor([[True] * 4, [False] + [True] * 3]))
    with pytest.raises(GeometryError, match="matching leading shape"):
        cosine_by_lag(torch.ones(4, 3), torch.ones(5, dtype=torch.bool))
    with pytest.raises(GeometryError, match="max_lag: expected an integer >= 1, got 0"):
        fit_exponential_decay(torch.ones(5), max_lag=0)


# ---- the diagnostic inside the hooked pass, on a tiny model ----

TEXTS = ["the cat sat on the mat and ran to the big red house", "a dog ran", "one two three four five six seven"]


@pytest.fixture(scope="module")
def model():
    """A tiny bridge over Llama (rotary, GQA); the tests using it also run under transformer-lens 3.9."""
    return tm.make_model("bridge-llama")


def cached_rows(model, rows):
    """hook_v (GQA-aligned) and the final query's pattern row of layer 0/1 for each sequence alone."""
    out = []
    for row in rows:
        names = {f(layer) for layer in (0, 1) for f in (value_hook, pattern_hook)}
        _, cache = model.run_with_cache(row[None], names_filter=lambda n: n in names)
        group = model.cfg.n_heads // model.cfg.n_key_value_heads
        kv = torch.arange(model.cfg.n_heads) // group
        out.append(
            {
                layer: (cache[value_hook(layer)][0][:, kv].transpose(0, 1), cache[pattern_hook(layer)][0, :, -1])
                for layer in (0, 1)
            }
        )
    return out


def token_rows(model, texts):
    return [model.to_tokens(t)[0] for t in texts]


def check_against_pure_functions(result, layers):
    """A result of ONE sequence (so its per-head means are that sequence's values) against the pure functions."""
    names = ("value_norm_by_position", "value_norm_cv", "sink_norm_ratio", "rho0", "decay_beta", "decay_mae")
    assert result.n_documents == 1
    for layer, (v, alpha) in layers.items():
        real = torch.ones(v.shape[:2], dtype=torch.bool)
        norms, cv, ratio = value_norm_statistics(v, real)
        lag = cosine_by_lag(v, real)
        beta, mae = fit_exponential_decay(lag)
        expected = dict(zip(names, (norms, cv, ratio, sink_similarity(v, real), beta, mae)))
        n = v.shape[1]
        for name, t in expected.items():
            got = result.per_head(name)[layer].float()
            torch.testing.assert_close(got, t.float(), equal_nan=True, msg=name)
        torch.testing.assert_close(result.per_head("cosine_by_lag")[layer].float(), lag, equal_nan=True)
        torch.testing.assert_close(result.per_head("attention_profile")[layer].float(), alpha.float())
        for name in ("value_norm_by_position", "cosine_by_lag", "attention_profile"):
            assert result.per_head(name).shape[-1] == n, name  # as wide as the sequence, no wider


def _context(values, alpha, kv_heads=None):
    """One layer's selection context over sequences of real keys, each with its last position as the query."""
    batch, heads, _, keys = alpha.shape
    return SelectionContext(
        alpha, values, torch.ones(batch, 1, keys, dtype=torch.bool), torch.zeros(batch, 1, dtype=torch.long),
        torch.ones(batch, 1, dtype=torch.bool), torch.tensor([1, 4]), query_index=torch.zeros(batch, 1, dtype=torch.long),
        kv_heads=kv_heads,
    )  # fmt: skip


@given(kv_heads=st.lists(st.integers(0, 3), min_size=1, max_size=6), seed=st.integers(0, 1000))
@settings(max_examples=15, deadline=None)
def test_value_statistics_once_per_kv_head_equal_those_of_every_head(kv_heads, seed):
    """Heads of one GQA group share their value states: the norms are computed once per group (one row per
    distinct KV head reaches `value_norm_statistics`), and that changes nothing."""
    gen = torch.Generator().manual_seed(seed)
    heads, keys = len(kv_heads), 12
    kv = torch.tensor(kv_heads)
    per_kv = torch.randn(2, keys, 4, 8, generator=gen) + 0.5
    alpha = torch.softmax(torch.randn(2, heads, 1, keys, generator=gen), -1)  # [batch, head, query_pos, key]
    grouped_context = _context(per_kv[:, :, kv], alpha, kv_heads=kv)
    settings_ = DIAGNOSTIC.Settings()
    with pytest.MonkeyPatch.context() as patch:  # not the monkeypatch fixture: hypothesis runs many examples
        calls = spy(patch, assumptions, "value_norm_statistics")
        grouped = DIAGNOSTIC.sequences(grouped_context, settings_)
    assert [args[0].shape[1] for args, _ in calls] == [len(set(kv_heads))]  # values [batch, head, key, d_head]
    every = DIAGNOSTIC.sequences(_context(per_kv[:, :, kv], alpha), settings_)
    assert grouped.keys() == every.keys() == {spec.name for spec in DIAGNOSTIC.fields}
    for name, t in every.items():
        torch.testing.assert_close(grouped[name], t, equal_nan=True, msg=name)


@pytest.mark.model
def test_diagnostic_in_the_hooked_pass_equals_the_pure_functions(model):
    rows = token_rows(model, TEXTS)
    cached = cached_rows(model, rows)
    # Per-sequence values: one sequence per run (the result keeps statistics over documents).
    alone = [run_with_geometry_hooks(model, text, diagnostics=["assumptions"], n_grid=[1, 2]) for text in TEXTS]
    for one, layers in zip(alone, cached, strict=True):
        check_against_pure_functions(one, layers)
    # Together, right-padded: position p averages the sequences that reach it, padding is never counted.
    result = run_with_geometry_hooks(model, TEXTS, diagnostics=["assumptions"], n_grid=[1, 2])
    width = max(len(r) for r in rows)
    assert result.value_norm_by_position.shape == (2, 4, width)
    assert result.profile_fit.p_base.shape == (2, 4)
    for name in ("value_norm_by_position", "attention_profile"):
        reaching = torch.tensor([sum(len(r) > p for r in rows) for p in range(width)])
        assert torch.equal(result.count(name), reaching.expand(2, 4, width)), name
    for name in ("value_norm_by_position", "cosine_by_lag", "attention_profile", "value_norm_cv", "rho0", "decay_beta"):
        each = [torch.nn.functional.pad(one.per_head(name), (0, width - len(r)) if one.spec(name).axes else (), value=math.nan)
                for one, r in zip(alone, rows, strict=True)]
        # float32 statistics (and float32 sums for the per-position fields): float32 tolerances.
        torch.testing.assert_close(result.per_head(name).float(), torch.nanmean(torch.stack(each), 0).float(),
                                   equal_nan=True, msg=name)


def _left_padded(rows, width):
    tokens = torch.full((len(rows), width), tm.PAD_ID)
    mask = torch.zeros_like(tokens)
    for i, r in enumerate(rows):
        tokens[i, width - len(r) :] = r
        mask[i, width - len(r) :] = 1
    return tokens, mask


@pytest.mark.model
def test_left_padding_is_shifted_to_the_sink(model):
    model32 = tm.make_model("bridge-llama", dtype=torch.float32)
    rows = token_rows(model32, TEXTS)
    width = max(len(r) for r in rows)
    names = ("value_norm_by_position", "value_norm_cv", "rho0", "cosine_by_lag", "attention_profile")
    # Each sequence alone (so the result holds its own values), left-padded to the batch width vs unpadded.
    for row, text in zip(rows, TEXTS, strict=True):
        tokens, mask = _left_padded([row], width + 2)
        left = run_with_geometry_hooks(model32, tokens, attention_mask=mask, diagnostics=["assumptions"], n_grid=[1])
        right = run_with_geometry_hooks(model32, text, diagnostics=["assumptions"], n_grid=[1])
        for name in names:
            got, want = left.per_head(name), right.per_head(name)
            if left.spec(name).axes:  # the padded run's axes are as wide as its padded row: NaN, uncounted, past the text
                n = want.shape[-1]
                assert got[..., n:].isnan().all() and not left.count(name)[..., n:].any(), name
                got = got[..., :n]
            torch.testing.assert_close(got, want, equal_nan=True, atol=1e-5, rtol=1e-4, msg=name)
    # And the whole batch, left- vs right-padded: every statistic over the sequences.
    tokens, mask = _left_padded(rows, width)
    left = run_with_geometry_hooks(model32, tokens, attention_mask=mask, diagnostics=["assumptions"], n_grid=[1])
    right = run_with_geometry_hooks(model32, TEXTS, diagnostics=["assumptions"], n_grid=[1])
    for name in names:
        assert torch.equal(left.count(name), right.count(name)), name
        torch.testing.assert_close(left.per_head(name), right.per_head(name), equal_nan=True, atol=1e-5, rtol=1e-4, msg=name)
        if left.spec(name).documents == "moments":
            for stat in (left.min, left.max):
                torch.testing.assert_close(stat(name), getattr(right, stat.__name__)(name), equal_nan=True, atol=1e-5, rtol=1e-4)


@pytest.mark.model
def test_diagnostic_output_shapes_are_layer_by_head(model):
    result = run_with_geometry_hooks(model, TEXTS[:2], diagnostics=["assumptions"], n_grid=[1], keep_queries=True)
    width = max(len(r) for r in token_rows(model, TEXTS[:2]))
    assert result.per_head("cosine_by_lag").shape == result.count("cosine_by_lag").shape == (2, 4, width)
    assert result.per_head("profile_error").shape == (2, 4)
    assert result.n_documents == 2
    # Values of a sequence (not of a query) are reduced per sequence: none of them has per-query rows.
    assert not {spec.name for spec in DIAGNOSTIC.fields} & set(result.queries)
    assert all(spec.queries in ("sequence", "last") for spec in DIAGNOSTIC.fields)


# ---- the real default model: one 1024-token window ----


@pytest.mark.slow
@pytest.mark.model
def test_assumptions_on_the_default_model(smollm2):
    from tl_geometry import default_text, text_windows

    n = 256  # a window long enough for the decay fits and the phase profile, short enough for the pattern path
    window = text_windows(smollm2, default_text(), context=n, n_windows=1)
    result = run_with_geometry_hooks(smollm2, window, diagnostics=["assumptions"], capture="pattern")  # as the cache
    layers, heads = smollm2.cfg.n_layers, smollm2.cfg.n_heads
    assert result.value_norm_by_position.shape == (layers, heads, n)
    assert result.cosine_by_lag.shape == result.attention_profile.shape == (layers, heads, n)
    for name in ("value_norm_cv", "sink_norm_ratio", "rho0", "decay_beta", "decay_mae"):
        t = result.per_head(name)
        assert t.shape == (layers, heads) and torch.isfinite(t).all(), name
    assert (result.value_norm_cv >= 0).all() and (result.sink_norm_ratio > 0).all()
    assert (result.rho0.abs() <= 1).all()
    # Per-position fields keep float32 sums (documents="mean"): compared in float32, as the values are.
    torch.testing.assert_close(result.cosine_by_lag[..., 0].float(), torch.ones(layers, heads))
    assert torch.isfinite(result.cosine_by_lag[..., :n - 2]).all() and result.cosine_by_lag[..., n - 1].isnan().all()
    torch.testing.assert_close(result.attention_profile.sum(-1).float(), torch.ones(layers, heads))
    fit = result.profile_fit
    assert torch.isfinite(fit.error).all() and (fit.t1 <= fit.t2).all() and (fit.t2 <= n - 1).all()
    corr = sink_recall_correlation(result).pearson
    assert corr[0].isnan() and torch.isfinite(corr[1:16]).all()  # R(r_min, 1) = 1 for every head: no spread

    names = {f(layer) for layer in (0, 17) for f in (value_hook, pattern_hook)}
    _, cache = smollm2.run_with_cache(window, names_filter=lambda name: name in names)
    kv = torch.arange(heads) // (heads // smollm2.cfg.n_key_value_heads)
    for layer in (0, 17):
        v = cache[value_hook(layer)][0][:, kv].transpose(0, 1)  # [head, pos, d_head]
        real = torch.ones(v.shape[:2], dtype=torch.bool)
        norms, cv, ratio = value_norm_statistics(v, real)
        lag = cosine_by_lag(v, real)
        beta, mae = fit_exponential_decay(lag)
        expected = {"value_norm_by_position": norms, "value_norm_cv": cv, "sink_norm_ratio": ratio,
                    "rho0": sink_similarity(v, real), "cosine_by_lag": lag, "decay_beta": beta, "decay_mae": mae,
                    "attention_profile": cache[pattern_hook(layer)][0, :, -1]}
        for name, t in expected.items():  # one window: the per-head means are its values
            torch.testing.assert_close(result.per_head(name)[layer].float(), t.float(), equal_nan=True, msg=name)
