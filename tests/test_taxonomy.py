"""Retriever / Mixer / Reset / unclassified: constructed heads, the issue's failures, reference rules, models.

The reference rules below are written from the sentences of section 4.2 of
the paper (quoted), one head at a time in plain Python; they share only the
thresholds (TaxonomyConfig) with the package.

Mutants and the test that catches each:
- Mixer's shift as one term of an average (not required): test_a_falling_cos_s_last_is_not_a_mixer;
- a NaN rule margin read as a met rule / argmax over NaN: test_undefined_evidence_is_unclassified;
- the Mixer reading the cosines at N = 1 of a sink-first head (cos_s_sink, cos_s_last): test_sink_first_fall_is_not_free;
- Reset comparing the sink with the last token only: test_reset_compares_the_sink_with_the_rest_too;
- two rules met resolved to the first: test_labels_from_margins_contradictory_and_undefined.
"""

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
from tl_geometry.results.result import GeometryResult
from tl_geometry.analysis.taxonomy import (
    NAMED,
    REASONS,
    REGIME_INPUTS,
    REGIMES,
    TaxonomyConfig,
    classify_heads,
    classify_queries,
    detect_regime,
    labels_from_margins,
    rule_conditions,
    rule_margins,
    threshold_sensitivity,
    with_regime_replicates,
)

K, D = 64, 16
GRID = torch.tensor([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64])


def unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def constructed_head(regime: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A head built to be a clear case of ``regime`` (alpha [K], values [K, D]; sink 0, last K-1).

    retriever: 70% of the attention on the current token, random directions.
    mixer: sink 40% (top-1), last token 30%, the context leans towards v_L (cos about 0.8).
    reset: sink 70%, current token 2%, context in random directions.
    """
    gen = torch.Generator().manual_seed(seed)
    v = unit(torch.randn(K, D, generator=gen, dtype=torch.float64))
    v[-1] = unit(v[-1] - (v[-1] @ v[0]) * v[0])  # sink and current token in orthogonal directions
    alpha = torch.zeros(K, dtype=torch.float64)
    if regime == "retriever":
        alpha[0], alpha[-1], rest = 0.1, 0.7, 0.2
    elif regime == "mixer":
        alpha[0], alpha[-1], rest = 0.4, 0.3, 0.3
        v[1:-1] = unit(0.8 * v[-1] + 0.6 * v[1:-1])
    else:
        alpha[0], alpha[-1], rest = 0.7, 0.02, 0.28
    alpha[1:-1] = rest / (K - 2)
    return alpha, v


def features_of(alpha, values, grid=GRID):
    """The taxonomy features of single rows ``alpha [row, K]`` (every key visible)."""
    return row_features(alpha, values, torch.ones(alpha.shape, dtype=torch.bool), grid)


def label_of(alpha, values, config=TaxonomyConfig(), grid=GRID):
    f = features_of(alpha[None], values[None], grid)
    labels, reasons = labels_from_margins(rule_margins(rule_conditions(f, grid, config)), config.min_margin)
    return REGIMES[int(labels[0])], REASONS[int(reasons[0])]


# ---- the reference: section 4.2, sentence by sentence ----


def reference_label(f: dict, grid: list[int], cfg: TaxonomyConfig) -> str:
    """One head's label from its features, written from the paper's three bullets."""
    # cos*: the cosines without the N where the top-N set is the sink alone (s(1) = y_0 for a sink-first head).
    cos_l, cos_0, cos_l_mixed = f["cos_s_last"], f["cos_s_sink_mixed"], f["cos_s_last_mixed"]
    c0, cl, cr = f["contribution_sink"], f["contribution_last"], f["contribution_rest"]

    def mean(xs):
        xs = [x for x in xs if not math.isnan(x)]
        return sum(xs) / len(xs) if xs else math.nan

    defined = [i for i, c in enumerate(cos_l) if not math.isnan(c)]
    if not defined or any(math.isnan(x) for x in (c0, cl, cr)):
        return "unclassified"
    n_max = max(grid[i] for i in defined)
    early = [i for i in defined if grid[i] <= cfg.n_small]
    late = [i for i in defined if grid[i] >= cfg.late_fraction * n_max]
    below = [i for i in defined if i not in late]
    # "Retriever. Last token dominates: ||alpha_L v_L|| is largest; s(N) stays strongly aligned with v_L
    # (high cos(s, v_L)) across N."
    retriever = [(cl - max(c0, cr)) / (cl + max(c0, cr)), mean([cos_l[i] for i in defined]) - cfg.align_high]
    # "Mixer. Last token is intermediate between sink and rest: alignment shifts from v_0 at small N towards
    # v_L as N increases (decreasing cos(s, v_0), increasing cos(s, v_L))."
    mixer = [
        min(cl - min(c0, cr), max(c0, cr) - cl) / (c0 + cr),
        mean([cos_l_mixed[i] for i in late]) - mean([cos_l_mixed[i] for i in early]) - cfg.shift_min,
        mean([cos_0[i] for i in early]) - mean([cos_0[i] for i in late]) - cfg.shift_min,
    ]
    # "Reset. Sink dominates or mass is broadly spread: ||alpha_0 v_0|| is comparable to or exceeds the others;
    # s(N) remains sink-biased with weak cos(s, v_L) except at very large N."
    others = max(cl, cr)
    reset = [(c0 - cfg.comparable * others) / (c0 + others), cfg.align_low - mean([cos_l[i] for i in below])]
    margins = [min(r) if not any(math.isnan(x) for x in r) else math.nan for r in (retriever, mixer, reset)]
    if any(math.isnan(m) for m in margins):
        return "unclassified"  # nothing undefined becomes a named regime
    met = [regime for regime, m in zip(NAMED, margins) if m > cfg.min_margin]
    return met[0] if len(met) == 1 else "unclassified"


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), keys=st.integers(2, 30), n_small=st.integers(1, 6), late=st.floats(0.05, 1.0),
       sharp=st.floats(0.5, 6.0))
def test_labels_match_the_reference(seed, keys, n_small, late, sharp):
    gen = torch.Generator().manual_seed(seed)
    alpha = torch.softmax(sharp * torch.randn(6, keys, generator=gen, dtype=torch.float64), -1)
    values = torch.randn(6, keys, 5, generator=gen, dtype=torch.float64)
    values[:, 1:] += values[:, -1:] * torch.rand(6, 1, 1, generator=gen, dtype=torch.float64)  # some v_L alignment
    grid = torch.tensor([1, 2, 3, 5, 8, 13, 21, 34])
    cfg = TaxonomyConfig(n_small=n_small, late_fraction=late)
    f = features_of(alpha, values, grid)
    labels, _ = labels_from_margins(rule_margins(rule_conditions(f, grid, cfg)), cfg.min_margin)
    for r in range(6):
        want = reference_label({k: (v[r].tolist() if v[r].ndim else float(v[r])) for k, v in f.items()}, grid.tolist(), cfg)
        assert REGIMES[int(labels[r])] == want, r


# ---- constructed heads ----


@pytest.mark.parametrize("regime", NAMED)
def test_constructed_heads_get_their_label(regime):
    for seed in range(5):
        assert label_of(*constructed_head(regime, seed)) == (regime, "met"), seed


@settings(max_examples=40, deadline=None)
@given(regime=st.sampled_from(NAMED), seed=st.integers(0, 1000), noise_seed=st.integers(0, 2**31 - 1),
       size=st.floats(0.0, 0.05))
def test_small_perturbations_do_not_flip_the_label(regime, seed, noise_seed, size):
    alpha, values = constructed_head(regime, seed)
    gen = torch.Generator().manual_seed(noise_seed)
    alpha = alpha * torch.exp(size * torch.randn(K, generator=gen, dtype=torch.float64))
    alpha = alpha / alpha.sum()
    values = values + size * torch.randn(K, D, generator=gen, dtype=torch.float64)
    assert label_of(alpha, values)[0] == regime


def test_a_falling_cos_s_last_is_not_a_mixer():
    """Sink first, last token between sink and rest, cos(s, v_0) falling, but cos(s, v_L) falling too."""
    v = torch.eye(D, dtype=torch.float64)[[0] + [2] * (K - 2) + [1]]  # v_0, v_L and the context orthogonal
    alpha = torch.zeros(K, dtype=torch.float64)
    alpha[0], alpha[-1] = 0.45, 0.3
    alpha[1:-1] = 0.25 / (K - 2)  # the context in a third direction: adding it pulls s away from v_0 and v_L
    f = features_of(alpha[None], v[None])
    lenient = TaxonomyConfig(shift_min=0.0)  # any fall of cos(s, v_0) counts
    conditions = rule_conditions(f, GRID, lenient)
    assert conditions["last_between"] > 0 and conditions["sink_falling"] > 0
    assert conditions["last_rising"] < 0  # cos(s, v_L) falls: the paper's criterion fails
    assert label_of(alpha, v, lenient)[0] != "mixer"


def test_sink_first_fall_is_not_free():
    """s(1) = y_0 gives cos(s(1), v_0) = 1: a fall measured from there holds for every sink-first head."""
    v = torch.eye(D, dtype=torch.float64)[[0] + [1] * (K - 1)]  # v_0 and v_L orthogonal; the context repeats v_L
    alpha = torch.full((K,), 1e-4, dtype=torch.float64)
    alpha[0], alpha[-1] = 0.4, 0.4  # the sink first (ties by index); from N = 2 on s(N) = 0.4 v_0 + 0.4 v_L + tiny
    f = features_of(alpha[None], v[None])
    assert math.isnan(f["cos_s_sink_mixed"][0, 0]) and f["cos_s_sink"][0, 0] == pytest.approx(1.0)
    assert rule_conditions(f, GRID, TaxonomyConfig())["sink_falling"] < 0
    # The old reading (both cosines from N = 1) would see the shift:
    naive = {**f, "cos_s_sink_mixed": f["cos_s_sink"], "cos_s_last_mixed": f["cos_s_last"]}
    assert rule_conditions(naive, GRID, TaxonomyConfig())["sink_falling"] > 0
    assert rule_conditions(naive, GRID, TaxonomyConfig())["last_rising"] > 0
    assert label_of(alpha, v)[0] != "mixer"


def test_reset_compares_the_sink_with_the_rest_too():
    """Sink far above the last token but far below the rest (one shared direction): not a Reset."""
    gen = torch.Generator().manual_seed(2)
    v = unit(torch.randn(K, D, generator=gen, dtype=torch.float64))
    v[1:-1] = unit(torch.randn(D, generator=gen, dtype=torch.float64))
    alpha = torch.zeros(K, dtype=torch.float64)
    alpha[0], alpha[-1] = 0.2, 0.02
    alpha[1:-1] = 0.78 / (K - 2)
    f = features_of(alpha[None], v[None])
    assert f["contribution_sink"][0] > f["contribution_last"][0] and f["contribution_rest"][0] > 3 * f["contribution_sink"][0]
    assert rule_conditions(f, GRID, TaxonomyConfig())["sink_comparable"] < 0
    assert label_of(alpha, v)[0] != "reset"


def test_undefined_evidence_is_unclassified():
    alpha, values = constructed_head("retriever", 0)
    # A grid without N <= n_small: no early range, the Mixer rule cannot be evaluated.
    assert label_of(alpha, values, grid=torch.tensor([5, 6, 7, 8])) == ("unclassified", "undefined")
    # An all-NaN head (e.g. a query at position 0, which sees a single key).
    f = {name: torch.full((1, len(GRID)) if name.startswith("cos") else (1,), math.nan) for name in REGIME_INPUTS}
    labels, reasons = labels_from_margins(rule_margins(rule_conditions(f, GRID, TaxonomyConfig())))
    assert (REGIMES[int(labels[0])], REASONS[int(reasons[0])]) == ("unclassified", "undefined")
    single = row_features(alpha[None, :1], values[None, :1], torch.ones(1, 1, dtype=torch.bool), GRID)
    labels, _ = labels_from_margins(rule_margins(rule_conditions(single, GRID, TaxonomyConfig())))
    assert REGIMES[int(labels[0])] == "unclassified"


def test_labels_from_margins_contradictory_and_undefined():
    margins = torch.tensor([[0.1, 0.2, -0.1], [-0.1, -0.2, -0.3], [0.3, math.nan, -1.0], [-0.1, -0.2, 0.05]])
    labels, reasons = labels_from_margins(margins)
    assert [REGIMES[i] for i in labels.tolist()] == ["unclassified", "unclassified", "unclassified", "reset"]
    assert [REASONS[i] for i in reasons.tolist()] == ["contradictory", "weak", "undefined", "met"]
    # min_margin: a rule met by less than it is not met.
    labels, reasons = labels_from_margins(margins[3:], min_margin=0.1)
    assert REASONS[int(reasons[0])] == "weak"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_small": 0}, "n_small: expected an integer >= 1, got 0"),
        ({"late_fraction": 1.5}, "late_fraction: expected a number in (0, 1], got 1.5"),
        ({"align_high": 2.0}, "align_high: expected a number in [-1, 1] (a cosine), got 2.0"),
        ({"shift_min": -0.1}, "shift_min: expected a number >= 0, got -0.1"),
        ({"comparable": math.nan}, "comparable: expected a finite number, got nan"),
        ({"min_confidence": 1.5}, "min_confidence: expected a number in [0, 1], got 1.5"),
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


@pytest.mark.model
def test_classify_heads_deterministic_and_independent_of_batching(tiny):
    config = GeometryConfig(diagnostics=["taxonomy"], n_grid=[1, 2, 4, 8])
    first = classify_heads(tiny, TEXTS, config, taxonomy=TaxonomyConfig())
    again = classify_heads(tiny, TEXTS, config)
    assert torch.equal(first.labels, again.labels) and torch.equal(first.scores.nan_to_num(), again.scores.nan_to_num())
    assert first.labels.shape == (tm.N_LAYERS, tm.N_HEADS) and first.scores.shape == (tm.N_LAYERS, tm.N_HEADS, 3)
    merged = GeometryResult.merge([run_with_geometry_hooks(tiny, text, config=config) for text in TEXTS])
    assert torch.equal(first.labels, classify_heads(merged).labels)
    counts = first.counts_by_layer()
    assert counts.shape == (tm.N_LAYERS, len(REGIMES)) and (counts.sum(-1) == tm.N_HEADS).all()
    assert not first.confidence.isnan().any()  # the rules' inputs keep replicates by default
    rows = first.table()
    assert len(rows) == tm.N_LAYERS * tm.N_HEADS and {r["label"] for r in rows} <= set(REGIMES)


@pytest.mark.model
def test_grids_and_queries_without_evidence_are_unclassified(tiny):
    for overrides in ({"n_grid": [5, 6, 7, 8]}, {"query_positions": [0]}):
        found = classify_heads(run_with_geometry_hooks(tiny, TEXTS, diagnostics=["taxonomy"], **overrides))
        assert (found.labels == REGIMES.index("unclassified")).all(), overrides
        assert (found.reason == REASONS.index("undefined")).all(), overrides


@pytest.mark.model
def test_confidence_is_the_share_of_bootstrap_replicates_that_agree(tiny):
    """Each replicate's label, from its own feature means by the reference rules, against the label."""
    config = with_regime_replicates(GeometryConfig(diagnostics=["taxonomy"], n_grid=[1, 2, 4, 8], n_bootstrap=40))
    result = run_with_geometry_hooks(tiny, TEXTS, config=config)
    cfg = TaxonomyConfig(min_confidence=0.9)
    found = classify_heads(result, taxonomy=cfg)
    grid = result.n_grid.tolist()
    replicates = {name: result.replicates(name) for name in REGIME_INPUTS}
    for layer in range(tm.N_LAYERS):
        for head in range(tm.N_HEADS):
            labels = []
            for b in range(40):
                f = {k: (v[b, layer, head].tolist() if v.ndim == 4 else float(v[b, layer, head])) for k, v in replicates.items()}
                if all(math.isnan(x) for x in [f["contribution_last"], *f["cos_s_last"]]):
                    continue  # a replicate that draws no document has no vote
                labels.append(reference_label(f, grid, cfg))
            want = sum(label == REGIMES[int(found.labels[layer, head])] for label in labels) / len(labels)
            assert float(found.confidence[layer, head]) == pytest.approx(want, abs=1e-6), (layer, head)
            assert bool(found.low_confidence[layer, head]) == (want < 0.9)
    plain = classify_heads(run_with_geometry_hooks(tiny, TEXTS, diagnostics=["taxonomy"], n_bootstrap=0))
    assert plain.confidence.isnan().all() and not plain.low_confidence.any()
    # A default run keeps no replicates of the rules' inputs (file size): no confidence, never a made-up one.
    default = classify_heads(run_with_geometry_hooks(tiny, TEXTS, diagnostics=["taxonomy"], n_grid=[1, 2, 4, 8]))
    assert default.confidence.isnan().all() and torch.equal(default.labels, found.labels)


@pytest.mark.model
def test_threshold_sensitivity_counts_the_changed_labels(tiny):
    result = run_with_geometry_hooks(tiny, TEXTS, diagnostics=["taxonomy"], n_grid=[1, 2, 3, 4, 5, 6, 7, 8])
    rows = threshold_sensitivity(result)
    base = classify_heads(result).labels
    assert [(r.threshold) for r in rows][::2] == ["align_high", "align_low", "shift_min", "comparable", "late_fraction", "n_small"]
    for row in rows:
        moved = classify_heads(result, taxonomy=TaxonomyConfig(**{row.threshold: type(getattr(TaxonomyConfig(), row.threshold))(row.value)}))
        assert row.changed == int((moved.labels != base).sum()), row
        assert list(row.counts) == moved.counts_by_layer().sum(0).tolist()
    assert [r.value for r in rows if r.threshold == "n_small"] == [3, 5]
    assert [r.value for r in rows if r.threshold == "align_high"] == pytest.approx([0.45, 0.55])
    with pytest.raises(GeometryError, match="step: expected a relative move in \\(0, 1\\)"):
        threshold_sensitivity(result, step=1.5)


@pytest.mark.model
def test_per_query_labels_equal_the_labels_of_that_query_alone(tiny):
    text = TEXTS[0]
    result = run_with_geometry_hooks(tiny, [text], diagnostics=["taxonomy"], query_positions="all", keep_queries=True, n_grid=[1, 2, 4, 8])
    per_query = classify_queries(result)
    positions = per_query.query_positions[0].tolist()
    assert per_query.labels.shape[:3] == (1, tm.N_LAYERS, tm.N_HEADS)
    for p in (0, 3, positions[-1]):
        alone = classify_heads(run_with_geometry_hooks(tiny, [text], diagnostics=["taxonomy"], query_positions=[p], n_grid=[1, 2, 4, 8]))
        assert per_query.at(0, p) == alone.label_names(), p
    assert per_query.at(0, 0) == [["unclassified"] * tm.N_HEADS] * tm.N_LAYERS  # the sink sees only itself
    with pytest.raises(GeometryError, match="kept no query at position 999"):
        per_query.at(0, 999)
    with pytest.raises(GeometryError, match="keeps no per-query rows; analyse with keep_queries=True"):
        classify_queries(run_with_geometry_hooks(tiny, [text], diagnostics=["taxonomy"]))


@pytest.mark.model
def test_summaries(tiny):
    result = run_with_geometry_hooks(tiny, TEXTS, diagnostics=["taxonomy"], n_grid=[1, 2, 4])
    found = classify_heads(result)
    curves = found.curves_by_regime("precision")
    assert curves.shape == (len(REGIMES), 3)
    for i in range(len(REGIMES)):
        members = result.precision[found.labels == i]
        if len(members) == 0:
            assert curves[i].isnan().all()
        else:
            torch.testing.assert_close(curves[i], torch.nanmean(members, 0), equal_nan=True)
    examples = found.example_heads()
    for i, regime in enumerate(REGIMES):
        where = examples[regime]
        assert (where is None) == (not (found.labels == i).any())
        if where is not None:
            assert found.labels[where] == i


@pytest.mark.model
def test_errors(tiny):
    plain = run_with_geometry_hooks(tiny, TEXTS[:1], n_grid=[1, 2])
    with pytest.raises(GeometryError, match="lacks the taxonomy features .* diagnostics=\\['taxonomy'\\]"):
        classify_heads(plain)
    with pytest.raises(GeometryError, match="tokens: required when classify_heads gets a model"):
        classify_heads(tiny)
    with pytest.raises(GeometryError, match="only used with a model"):
        classify_heads(plain, TEXTS)
    with pytest.raises(GeometryError, match="taxonomy: expected a TaxonomyConfig or None, got dict"):
        classify_heads(tiny, TEXTS, taxonomy={})
    with pytest.raises(GeometryError, match="regime: expected one of \\('retriever', 'mixer', 'reset'\\), got 'unclassified'"):
        detect_regime(tiny, TEXTS[0], "unclassified")


@pytest.mark.model
def test_detect_regime_has_detect_heads_shape(tiny):
    found = classify_heads(tiny, TEXTS[0])
    scores = detect_regime(tiny, TEXTS[0], "mixer")
    assert scores.shape == (tm.N_LAYERS, tm.N_HEADS)
    torch.testing.assert_close(scores, found.scores[..., 1], equal_nan=True)
    some = detect_regime(tiny, TEXTS[0], "reset", heads=[(1, 2), (0, 0)])
    torch.testing.assert_close(some[1, 2], found.scores[1, 2, 2], equal_nan=True)
    others = torch.ones_like(some, dtype=torch.bool)
    others[1, 2] = others[0, 0] = False
    assert some[others].isnan().all()


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
        table[name] = torch.bincount(found.labels[chosen], minlength=len(REGIMES)).tolist()
        assert sum(table[name]) == int(chosen.sum())
    table["all heads"] = torch.bincount(found.labels.flatten(), minlength=len(REGIMES)).tolist()
    print(f"regimes {REGIMES} of detected heads:", table)
