"""Retriever / Mixer / Reset labels: constructed heads, robustness, reference rules, tiny and real models."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import tiny_models as tm
from tl_geometry.config import GeometryConfig
from tl_geometry.errors import GeometryError
from tl_geometry.diagnostics.taxonomy import row_features
from tl_geometry.capture.hooks import run_with_geometry_hooks
from tl_geometry.engine.metrics import selection_metrics
from tl_geometry.results.result import GeometryResult
from tl_geometry.analysis.taxonomy import (
    CRITERIA,
    REGIME_INPUTS,
    REGIMES,
    TaxonomyConfig,
    classify_heads,
    detect_regime,
    labels_from_scores,
    regime_criteria,
    regime_scores,
)

K, D = 64, 16
GRID = torch.tensor([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64])


def unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def constructed_head(regime: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A head built to be a clear case of ``regime`` (alpha [K], values [K, D]; sink 0, last K-1).

    retriever: 70% of the attention on the current token, random directions.
    mixer: sink 40% (top-1), last token 30%, the context shares v_L's direction in part.
    reset: sink 70%, current token 2%, context in random directions.
    """
    gen = torch.Generator().manual_seed(seed)
    v = unit(torch.randn(K, D, generator=gen, dtype=torch.float64))
    alpha = torch.zeros(K, dtype=torch.float64)
    if regime == "retriever":
        alpha[0], alpha[-1], rest = 0.1, 0.7, 0.2
    elif regime == "mixer":
        alpha[0], alpha[-1], rest = 0.4, 0.3, 0.3
        v[1:-1] = unit(0.5 * v[-1] + 0.87 * v[1:-1])
    else:
        alpha[0], alpha[-1], rest = 0.7, 0.02, 0.28
    alpha[1:-1] = rest / (K - 2)
    return alpha, v


def features_of(alpha, values, mask, grid):
    """The inputs of the regime rules for independent rows: the taxonomy features and ||s(N)|| (a selection metric)."""
    return {**row_features(alpha, values, mask, grid), "s_norm": selection_metrics(alpha, values, grid, key_mask=mask).s_norm}


def label_of(alpha, values, config=TaxonomyConfig()):
    f = features_of(alpha[None], values[None], torch.ones(1, alpha.shape[-1], dtype=torch.bool), GRID)
    scores = regime_scores(regime_criteria(f, GRID, config), config)
    return REGIMES[int(labels_from_scores(scores)[0])], scores[0]


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("combine", ["mean", "geometric"])
def test_constructed_heads_get_their_label(regime, combine):
    for seed in range(5):
        label, scores = label_of(*constructed_head(regime, seed), TaxonomyConfig(combine=combine))
        assert label == regime, (seed, scores)
        assert ((scores >= 0) & (scores <= 1)).all()


@settings(max_examples=40, deadline=None)
@given(
    regime=st.sampled_from(REGIMES),
    seed=st.integers(0, 1000),
    noise_seed=st.integers(0, 2**31 - 1),
    size=st.floats(0.0, 0.05),
)
def test_small_perturbations_do_not_flip_the_label(regime, seed, noise_seed, size):
    alpha, values = constructed_head(regime, seed)
    gen = torch.Generator().manual_seed(noise_seed)
    alpha = alpha * torch.exp(size * torch.randn(K, generator=gen, dtype=torch.float64))
    alpha = alpha / alpha.sum()
    values = values + size * torch.randn(K, D, generator=gen, dtype=torch.float64)
    assert label_of(alpha, values)[0] == regime


def reference_criteria(f: dict, grid: list[int], cfg: TaxonomyConfig) -> dict[str, float]:
    """The nine sub-scores of one head from its features, written from the module docstring."""
    valid = [i for i, c in enumerate(f["cos_s_last"]) if not math.isnan(c)]
    n_max = max(grid[i] for i in valid)
    early = [i for i in valid if grid[i] <= cfg.n_small]
    late = [i for i in valid if grid[i] >= cfg.late_fraction * n_max]
    below = [i for i in valid if i not in late] or early

    def mean(xs):
        return sum(xs) / len(xs) if xs else math.nan

    def clip(x):
        return min(1.0, max(0.0, x))

    c0, cl, cr = f["contribution_sink"], f["contribution_last"], f["contribution_rest"]
    s, s0, sl = f["s_norm"], f["s_norm_without_sink"], f["s_norm_without_last"]
    cos_l, cos_0 = f["cos_s_last"], f["cos_s_sink"]
    eps = 1e-12
    drop_l = mean([clip((s[i] - sl[i]) / (s[i] + eps)) for i in valid])
    drop_0 = mean([clip((s[i] - s0[i]) / (s[i] + eps)) for i in valid])
    shift = mean([cos_l[i] for i in late]) - mean([cos_l[i] for i in early])
    shift += mean([cos_0[i] for i in early]) - mean([cos_0[i] for i in late])
    return {
        "last_dominance": min(1.0, cl / (max(c0, cr) + eps)),
        "last_alignment": mean([max(cos_l[i], 0.0) for i in valid]),
        "last_removal": drop_l,
        "last_between": min(1.0, cl / (min(c0, cr) + eps), max(c0, cr) / (cl + eps)),
        "alignment_shift": clip(shift / (2 * cfg.shift_full)),
        "loo_convergence": mean([clip(1 - abs(s0[i] - sl[i]) / (s[i] + eps)) for i in late]),
        "sink_weight": min(1.0, c0 / (cl + eps)),
        "weak_last": 1 - mean([max(cos_l[i], 0.0) for i in below]),
        "sink_removal": clip(0.5 + (drop_0 - drop_l) / 2),
    }


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), keys=st.integers(2, 30), n_small=st.integers(1, 6), late=st.floats(0.05, 1.0))
def test_criteria_match_reference(seed, keys, n_small, late):
    gen = torch.Generator().manual_seed(seed)
    alpha = torch.softmax(3 * torch.randn(4, keys, generator=gen, dtype=torch.float64), -1)
    values = torch.randn(4, keys, 5, generator=gen, dtype=torch.float64)
    grid = torch.tensor([1, 2, 3, 5, 8, 13, 21, 34])
    cfg = TaxonomyConfig(n_small=n_small, late_fraction=late)
    features = features_of(alpha, values, torch.ones(4, keys, dtype=torch.bool), grid)
    fast = regime_criteria(features, grid, cfg)
    for r in range(4):
        want = reference_criteria({k: v[r].tolist() for k, v in features.items()}, grid.tolist(), cfg)
        for name, value in want.items():
            assert fast[name][r].item() == pytest.approx(value, abs=1e-9, nan_ok=True), name
    scores = regime_scores(fast, cfg)
    for i, regime in enumerate(REGIMES):
        mean = sum(fast[c] for c in CRITERIA[regime]) / 3
        torch.testing.assert_close(scores[..., i], mean, equal_nan=True)


def test_ties_go_to_the_first_regime_and_nan_loses():
    scores = torch.tensor([[0.5, 0.5, 0.5], [0.1, 0.7, 0.7], [math.nan, math.nan, 0.2]])
    assert labels_from_scores(scores).tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_small": 0}, "n_small: expected an integer >= 1, got 0"),
        ({"late_fraction": 1.5}, "late_fraction: expected a number in (0, 1], got 1.5"),
        ({"shift_full": 0.0}, "shift_full: expected a number > 0, got 0.0"),
        ({"shift_full": math.nan}, "shift_full: expected a finite number, got nan"),
        ({"combine": "max"}, "combine: expected one of ('mean', 'geometric'), got 'max'"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(GeometryError) as info:
        TaxonomyConfig(**kwargs)
    assert str(info.value) == message


# ---- tiny models ----

TEXTS = ["the cat sat on the mat and ran", "a dog", "one two three four five six seven eight", "big red sun"]


@pytest.fixture(scope="module")
def tiny():
    return tm.make_model("bridge-llama")


def reference_label(f: dict, grid: list[int], cfg: TaxonomyConfig) -> int | None:
    """The label of one head from its features (mean of each regime's criteria, ties to the first regime,
    NaN scores lose); None where no N is defined (nothing to label)."""
    if all(math.isnan(c) for c in f["cos_s_last"]):
        return None
    criteria = reference_criteria(f, grid, cfg)
    scores = [sum(criteria[c] for c in CRITERIA[regime]) / 3 for regime in REGIMES]
    best = max((x for x in scores if not math.isnan(x)), default=None)
    return None if best is None else scores.index(best)


@pytest.mark.model
def test_classify_heads_deterministic_and_independent_of_batching(tiny):
    config = GeometryConfig(diagnostics=["taxonomy"], n_grid=[1, 2, 4, 8])  # one grid for every run below
    first = classify_heads(tiny, TEXTS, config, taxonomy=TaxonomyConfig())
    again = classify_heads(tiny, TEXTS, config)
    assert torch.equal(first.labels, again.labels) and torch.equal(first.scores, again.scores)
    assert first.labels.shape == (tm.N_LAYERS, tm.N_HEADS) and first.scores.shape == (tm.N_LAYERS, tm.N_HEADS, 3)
    # Padding and batch size change nothing: the texts one run each, merged, give the same labels. (Labels per
    # sequence no longer exist: a result keeps statistics over documents, not each document's features.)
    merged = GeometryResult.merge([run_with_geometry_hooks(tiny, text, config=config) for text in TEXTS])
    alone = classify_heads(merged)
    assert torch.equal(first.labels, alone.labels)
    torch.testing.assert_close(first.scores, alone.scores)
    counts = first.counts_by_layer()
    assert counts.shape == (tm.N_LAYERS, 3) and (counts.sum(-1) == tm.N_HEADS).all()
    assert first.confidence.isnan().all()  # the default run keeps no replicates of the features


@pytest.mark.model
def test_confidence_is_the_share_of_bootstrap_replicates_that_agree(tiny):
    """Each replicate's label, from its own feature means by the reference rules, against the label."""
    result = run_with_geometry_hooks(
        tiny, TEXTS, diagnostics=["taxonomy"], n_grid=[1, 2, 4, 8], bootstrap_fields=REGIME_INPUTS, n_bootstrap=40
    )
    found = classify_heads(result)
    cfg, grid = TaxonomyConfig(), result.n_grid.tolist()
    replicates = {name: result.replicates(name) for name in REGIME_INPUTS}
    n_replicates = replicates["s_norm"].shape[0]
    assert n_replicates == 40
    for layer in range(tm.N_LAYERS):
        for head in range(tm.N_HEADS):
            labels = [
                reference_label({k: v[b, layer, head].tolist() for k, v in replicates.items()}, grid, cfg)
                for b in range(n_replicates)
            ]
            labelled = [label for label in labels if label is not None]  # a replicate of no document has no label
            assert labelled, (layer, head)
            want = sum(label == int(found.labels[layer, head]) for label in labelled) / len(labelled)
            assert float(found.confidence[layer, head]) == pytest.approx(want, abs=1e-6), (layer, head, labels)


@pytest.mark.model
def test_summaries(tiny):
    result = run_with_geometry_hooks(tiny, TEXTS, diagnostics=["taxonomy"], n_grid=[1, 2, 4])
    found = classify_heads(result)
    precision = result.precision
    curves = found.curves_by_regime("precision")
    assert curves.shape == (3, 3)
    for i in range(3):
        members = precision[found.labels == i]
        if len(members) == 0:
            assert curves[i].isnan().all()
        else:
            torch.testing.assert_close(curves[i], torch.nanmean(members, 0), equal_nan=True)
    examples = found.example_heads()
    for i, regime in enumerate(REGIMES):
        where = examples[regime]
        assert (where is None) == (not (found.labels == i).any())
        if where is not None:
            layer, head = where
            assert found.labels[layer, head] == i
            assert found.scores[layer, head, i] == found.scores[..., i][found.labels == i].max()
            assert found.contributions_by_regime()[regime].shape == (result.per_head("contribution_by_position").shape[-1],)
    assert found.label_names()[0][0] in REGIMES


@pytest.mark.model
def test_errors(tiny):
    plain = run_with_geometry_hooks(tiny, TEXTS[:1], n_grid=[1, 2])
    with pytest.raises(GeometryError, match="lacks the taxonomy features .* diagnostics=\\['taxonomy'\\]"):
        classify_heads(plain)
    with pytest.raises(GeometryError, match="tokens: required when classify_heads gets a model"):
        classify_heads(tiny)
    with pytest.raises(GeometryError, match="only used with a model"):
        classify_heads(plain, TEXTS)
    with pytest.raises(GeometryError, match="expected a GeometryResult or a TransformerLens model, got list"):
        classify_heads([1, 2])
    with pytest.raises(GeometryError, match="taxonomy: expected a TaxonomyConfig or None, got dict"):
        classify_heads(tiny, TEXTS, taxonomy={})
    with pytest.raises(GeometryError, match="regime: expected one of \\('retriever', 'mixer', 'reset'\\), got 'copy'"):
        detect_regime(tiny, TEXTS[0], "copy")


@pytest.mark.model
def test_detect_regime_has_detect_heads_shape(tiny):
    found = classify_heads(tiny, TEXTS[0])
    scores = detect_regime(tiny, TEXTS[0], "mixer")
    assert scores.shape == (tm.N_LAYERS, tm.N_HEADS)
    torch.testing.assert_close(scores, found.scores[..., 1])
    some = detect_regime(tiny, TEXTS[0], "reset", heads=[(1, 2), (0, 0)])
    assert some[1, 2] == pytest.approx(float(found.scores[1, 2, 2]))
    assert some[0, 0] == pytest.approx(float(found.scores[0, 0, 2]))
    others = torch.ones_like(some, dtype=torch.bool)
    others[1, 2] = others[0, 0] = False
    assert (some[others] == -1).all()


# ---- the real default model ----


def repeated_random_prompt(model, length: int, seed: int) -> str:
    """BOS + the same random single-token words twice, as a string that tokenises back to exactly that."""
    rng = np.random.default_rng(seed)
    tokenizer = model.tokenizer
    chosen: list[int] = []
    while len(chosen) < length:
        token = int(rng.integers(1000, tokenizer.vocab_size))
        piece = tokenizer.decode([token])
        if piece.startswith(" ") and piece[1:].isalpha() and token not in chosen:
            chosen.append(token)
    text = tokenizer.decode(chosen) * 2
    tokens = model.to_tokens(text)[0].tolist()
    assert tokens[1:] == chosen + chosen, "the repeated prompt does not round-trip through the tokenizer"
    return text


@pytest.mark.slow
@pytest.mark.model
def test_detect_head_cross_tab_on_default_model(smollm2):
    from transformer_lens.head_detector import detect_head

    text = repeated_random_prompt(smollm2, 50, seed=0)
    previous = detect_head(smollm2, text, "previous_token_head")
    induction = detect_head(smollm2, text, "induction_head")
    found = classify_heads(smollm2, text)
    n_layers, n_heads = smollm2.cfg.n_layers, smollm2.cfg.n_heads
    assert previous.shape == induction.shape == found.labels.shape == (n_layers, n_heads)
    table = {}
    for name, score in (("previous_token_head", previous), ("induction_head", induction)):
        chosen = score > 0.4
        table[name] = torch.bincount(found.labels[chosen], minlength=3).tolist()
        assert sum(table[name]) == int(chosen.sum())
    table["all heads"] = torch.bincount(found.labels.flatten(), minlength=3).tolist()
    print("regimes (retriever, mixer, reset) of detected heads:", table)
