"""intervention_sweep, InterventionResult, N*_tau and the geometry-function correlation.

The dNLL reference is a hand-written hook (a Python loop over rows, top-N by
sorting (-alpha, key)) and an NLL from ``log_softmax``, not the package's helpers.
"""

import math

import pytest
import torch

from tests.tiny_models import (
    has_hooked_transformer,
    make_model,
    random_tokens,
    tl_major_version,
    with_bos,
)
from tl_geometry.analysis.sweep_statistics import (
    NeedsN,
    curve_oracle,
    n_star_of,
    search_n_star,
    spearman,
)
from tl_geometry.interventions.sweep import (
    blocks_below_skipped,
    document_nll,
    effective_set_size,
    intervention_sweep,
)
from tl_geometry.errors import GeometryError
from tl_geometry.results.intervention_result import InterventionResult

pytestmark = pytest.mark.model
QUIET = dict(progress=False, n_bootstrap=16)


def reference_nll(logits, tokens):
    """Mean next-token NLL per sequence: -log_softmax at the next token, averaged over positions."""
    logp = logits.double().log_softmax(-1)[:, :-1]
    return -logp.gather(-1, tokens[:, 1:, None]).squeeze(-1).mean(-1)


def hand_edit_hook(n, mode):
    def hook(pattern, *, hook):
        out = pattern.clone()
        n_q, n_k = pattern.shape[-2:]
        for b in range(pattern.shape[0]):
            for h in range(pattern.shape[1]):
                for q in range(n_q):
                    keys = list(range(q + 1))  # causal, no padding, no window
                    if len(keys) <= n:
                        continue
                    top = sorted(keys, key=lambda k: (-float(pattern[b, h, q, k]), k))[:n]
                    row = torch.zeros(n_k, dtype=pattern.dtype)
                    row[top] = pattern[b, h, q, top]
                    out[b, h, q] = row / row.sum() if mode == "renormalise" else row
        return out
    return hook


@pytest.fixture(scope="module")
def model():
    return make_model("bridge-llama")


@pytest.fixture(scope="module")
def tokens():
    return with_bos(random_tokens(4, 10, seed=3))


@pytest.mark.parametrize("mode", ["renormalise", "delete"])
def test_sweep_matches_a_hand_written_edit(model, tokens, mode):
    """Mutants caught: dNLL with the wrong sign, NLL averaged over the BOS prediction, the wrong layer cut."""
    sweep = intervention_sweep(model, tokens, [2, 5], modes=(mode,), scope="layer", layers=[1], controls=0, **QUIET)
    with torch.inference_mode():
        clean = reference_nll(model(tokens), tokens)
        with model.hooks(fwd_hooks=[("blocks.1.attn.hook_pattern", hand_edit_hook(5, mode))]):
            edited = reference_nll(model(tokens), tokens)
    expected = (edited - clean).mean()
    assert sweep.sel(mode, layer=1, head=-1, n=5).item() == pytest.approx(expected.item(), abs=1e-10)
    assert sweep.nll_clean() == pytest.approx(clean.mean().item(), abs=1e-10)
    assert sweep.relative(mode)[0, 0, 1].item() == pytest.approx((expected / clean.mean()).item(), abs=1e-10)


def test_n_covering_every_key_gives_zero_dnll(model, tokens):
    sweep = intervention_sweep(model, tokens, [1, tokens.shape[1]], controls=2, **QUIET)
    for mode in sweep.modes:
        assert sweep.dnll(mode)[..., -1].abs().max().item() == 0.0
        assert sweep.controls(mode)[..., -1, :].abs().max().item() == 0.0
        assert sweep.dnll(mode)[..., 0].abs().min().item() > 0.0


def test_halves_merge_into_the_whole_and_files_round_trip(model, tokens, tmp_path):
    """Mutants caught: merge that drops a half's counts; a save that loses the control axis."""
    kwargs = dict(n_grid=[1, 3], scope="head", layers=[0], heads=[1, 2], controls=2, **QUIET)
    whole = intervention_sweep(model, tokens, **kwargs)
    merged = intervention_sweep(model, tokens[:2], **kwargs).merge(intervention_sweep(model, tokens[2:], **kwargs))
    assert merged.n_documents == whole.n_documents == 4
    for name, s in whole.stats.items():
        assert torch.equal(s.count, merged.stats[name].count)
        assert torch.allclose(s.total, merged.stats[name].total, atol=1e-12)
        if s.replicate_total is not None:
            assert torch.allclose(s.replicate_total, merged.stats[name].replicate_total, atol=1e-5)
    whole.save(tmp_path / "sweep")
    loaded = InterventionResult.load(tmp_path / "sweep")
    assert loaded.equals(whole)
    assert loaded.controls("delete").shape == (1, 2, 2, 2)
    with pytest.raises(GeometryError, match="differ in n_controls"):
        whole.merge(intervention_sweep(model, tokens, **{**kwargs, "controls": 1}))


def test_padded_windows_equal_windows_run_alone(model):
    """Padding keys are never candidates: a right-padded batch gives each window's own dNLL."""
    texts = ["the cat sat on the mat and ran", "a big red dog ran to the house and the tree and the sea"]
    kwargs = dict(n_grid=[2], modes=("renormalise",), controls=0, progress=False, n_bootstrap=0)
    together = intervention_sweep(model, texts, batch_size=2, **kwargs)
    alone = intervention_sweep(model, texts, batch_size=1, **kwargs)
    assert together.dnll("renormalise").item() == pytest.approx(alone.dnll("renormalise").item(), abs=1e-9)


@pytest.mark.skipif(tl_major_version() < 4 and not has_hooked_transformer(), reason="needs start_at_layer")
def test_start_at_layer_reuse_gives_the_same_dnll(tokens):
    kind = "bridge-llama" if tl_major_version() >= 4 else "hooked"
    model = make_model(kind)
    kwargs = dict(n_grid=[1, 4], scope="layer", controls=1, **QUIET)
    a = intervention_sweep(model, tokens, reuse_residual=False, **kwargs)
    b = intervention_sweep(model, tokens, reuse_residual=True, **kwargs)
    for mode in a.modes:
        assert torch.allclose(a.dnll(mode), b.dnll(mode), atol=1e-10)


@pytest.mark.skipif(tl_major_version() < 4, reason="transformer-lens 4 bridge's start_at_layer")
@pytest.mark.parametrize("kind", ["bridge-llama", "compat-llama"])
def test_reuse_runs_no_block_below_the_intervened_layer(tokens, kind):
    """The bridge's start_at_layer would run every block and discard the lower ones: with the reuse, the blocks
    below the intervened layer run in the clean pass only, and the wrapped layers get their own forward back."""
    model = make_model(kind)
    last = model.cfg.n_layers - 1
    layers = [block.original_component for block in model.blocks]
    calls = [0] * len(layers)

    def count(i):
        def hook(module, args):
            calls[i] += 1
        return hook

    attention = [layer.self_attn.register_forward_pre_hook(count(i)) for i, layer in enumerate(layers)]
    try:
        kwargs = dict(n_grid=[1, 4], scope="layer", layers=[last], controls=1, batch_size=len(tokens), **QUIET)
        intervention_sweep(model, tokens, reuse_residual=False, **kwargs)  # also checks once that edits take
        calls[:] = [0] * len(layers)
        intervention_sweep(model, tokens, reuse_residual=False, **kwargs)
        settings = 2 * 2 * 2  # modes x N x (ranking + 1 control)
        assert calls == [1 + settings] * len(layers)
        calls[:] = [0] * len(layers)
        intervention_sweep(model, tokens, reuse_residual=True, **kwargs)
        assert calls[:last] == [1] * last  # the clean pass only
        assert calls[last] == 1 + settings
    finally:
        for handle in attention:
            handle.remove()
    assert all("forward" not in layer.__dict__ for layer in layers)


def test_skipped_blocks_get_their_forward_back_whatever_happens():
    model = make_model("bridge-llama")
    layers = [block.original_component for block in model.blocks]
    own = layers[0].forward
    layers[0].forward = own  # an instance-level forward (as accelerate installs) must survive
    with pytest.raises(RuntimeError, match="inside"), blocks_below_skipped(model, len(layers)):
        assert all(layer.forward is not own for layer in layers)
        raise RuntimeError("inside")
    assert layers[0].__dict__["forward"] is own
    assert all("forward" not in layer.__dict__ for layer in layers[1:])


@pytest.mark.tl3
@pytest.mark.skipif(tl_major_version() >= 4, reason="transformer-lens 3.x bridge")
def test_reuse_refused_where_the_bridge_cannot_start_at_a_layer(tokens):
    with pytest.raises(GeometryError, match="start_at_layer"):
        intervention_sweep(make_model("bridge-llama"), tokens, [1], scope="layer", reuse_residual=True, **QUIET)


def test_sliding_window_layers_never_keep_hidden_keys():
    """A tiny Mistral (window 3): N = 3 sees every key a windowed query can see, so nothing changes."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    from tests.tiny_models import BOS_ID, PAD_ID, VOCAB_SIZE, sharpen, tiny_tokenizer

    config = transformers.MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        sliding_window=3, vocab_size=VOCAB_SIZE, bos_token_id=BOS_ID,
                                        eos_token_id=BOS_ID, pad_token_id=PAD_ID)
    torch.manual_seed(0)
    hf_model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float64).eval()
    sharpen(hf_model, 0, 0.3)
    bridge = TransformerBridge.boot_transformers("tiny-mistral", hf_model=hf_model, tokenizer=tiny_tokenizer(),
                                                 dtype=torch.float64).eval()
    tokens = with_bos(random_tokens(2, 9))
    sweep = intervention_sweep(bridge, tokens, [2, 3], controls=2, **QUIET)
    for mode in sweep.modes:
        assert sweep.dnll(mode)[0, 0, 1].item() == 0.0  # N = window: rows unchanged
        assert sweep.controls(mode)[0, 0, 1].abs().max().item() == 0.0
        assert sweep.dnll(mode)[0, 0, 0].item() != 0.0


def test_document_nll_matches_log_softmax():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 11, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, 11, (3, 6), generator=gen)
    got = document_nll(logits, tokens, torch.ones(3, 6, dtype=torch.bool))
    assert torch.allclose(got, reference_nll(logits, tokens), atol=1e-12)


def brute_force_n_star(curve, tau):
    return next((n for n in sorted(curve) if curve[n] <= tau), None)


@pytest.mark.parametrize("seed", range(20))
def test_search_finds_the_smallest_passing_n_on_monotone_curves(seed):
    """Mutants caught: bisection that keeps the failing end; a power-of-two answer without bisection."""
    gen = torch.Generator().manual_seed(seed)
    max_n = int(torch.randint(2, 300, (1,), generator=gen))
    steps = torch.rand(max_n, generator=gen, dtype=torch.float64)
    curve = dict(zip(range(1, max_n + 1), (1 - steps.cumsum(0) / steps.sum()).tolist()))
    tau = float(torch.rand(1, generator=gen))
    assert search_n_star(curve.__getitem__, tau, max_n) == brute_force_n_star(curve, tau)


def test_search_refines_within_three_on_a_dip():
    """The +-3 step: a curve that dips below tau two before the bisection's answer. Mutant caught: no refinement."""
    curve = {n: (0.0 if n >= 20 else 1.0) for n in range(1, 65)}
    curve[18] = 0.0  # bisection between 16 and 32 lands on 20 (19 fails); 18 is within 3
    assert search_n_star(curve.__getitem__, 0.05, 64) == 18
    assert search_n_star(lambda n: 1.0, 0.05, 64) is None
    with pytest.raises(NeedsN):
        search_n_star(curve_oracle([1, 2], [1.0, 1.0]), 0.05, 64)


def test_the_search_of_one_unit_shows_its_passes_and_is_quiet_when_asked(model, tokens, capsys):
    shown = effective_set_size(model, tokens, scope="model", taus=(0.05,), progress=True, n_bootstrap=0)
    err = capsys.readouterr().err
    assert "tl_geometry: N*_tau search" in err and "pass" in err and "every head (1 of 1), N = 1," in err
    quiet = effective_set_size(model, tokens, scope="model", taus=(0.05,), progress=False, n_bootstrap=0)
    assert capsys.readouterr().err == ""
    assert torch.equal(shown.n_star, quiet.n_star)


def test_the_search_names_a_head_as_readers_see_heads(model, tokens, capsys):
    """A head unit reads "L0H1" in the progress bar (as everywhere), never "0.1", which reads as a number."""
    effective_set_size(model, tokens[:1], scope="head", layers=[0], heads=[1], taus=(0.05,), progress=True,
                       n_bootstrap=0)  # fmt: skip
    err = capsys.readouterr().err
    assert "L0H1 (1 of 1), N = " in err and "head 0.1" not in err


def test_effective_set_size_searches_each_unit(model, tokens):
    e = effective_set_size(model, tokens, scope="layer", taus=(0.05, 0.5), **QUIET)
    assert e.n_star.shape == (2, 2, 1)
    for i, sweep in enumerate(e.sweeps):
        rel = sweep.relative("renormalise")[0, 0]
        oracle = curve_oracle(sweep.n_grid.tolist(), rel.tolist())
        assert e.n_star[0, i, 0].item() == search_n_star(oracle, 0.05, tokens.shape[1])
        assert bool((e.low[:, i] <= e.high[:, i]).all())
    assert bool((e.n_star[1] <= e.n_star[0]).all())  # a looser tolerance never needs more keys
    with pytest.raises(GeometryError, match="lacks N"):
        n_star_of(intervention_sweep(model, tokens, [2], modes=("renormalise",), controls=0, **QUIET),
                  "renormalise", (0.05,), tokens.shape[1])


def reference_spearman(x, y):
    """Pearson correlation of average ranks, in plain Python."""
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))


def test_spearman_against_the_definition():
    """Mutants caught: ties ranked by position; NaN pairs kept."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 5, (6, 12), generator=gen).double()  # many ties
    y = torch.randn(6, 12, generator=gen, dtype=torch.float64)
    got = spearman(x, y)
    for k in range(6):
        assert got[k].item() == pytest.approx(reference_spearman(x[k].tolist(), y[k].tolist()), abs=1e-12)
    x[0, 0] = math.nan
    assert spearman(x[0], y[0]).item() == pytest.approx(reference_spearman(x[0, 1:].tolist(), y[0, 1:].tolist()))


def test_geometry_against_dnll_and_the_report_figures(model, tokens, tmp_path):
    """rho per N is Spearman of the per-head means; the report gains the three figures."""
    from tl_geometry import run_with_geometry_hooks
    from tl_geometry.analysis.sweep_statistics import geometry_vs_dnll
    from tl_geometry.report.html import intervention_figures, write_report

    heads = intervention_sweep(model, tokens, [2, 4], scope="head", modes=("renormalise",), controls=0, **QUIET)
    geometry = run_with_geometry_hooks(model, tokens, n_grid=[2, 4], n_bootstrap=16,
                                       bootstrap_fields=["precision", "recall", "f_score"])
    corr = geometry_vs_dnll(geometry, heads, field="precision")
    x = geometry.per_head("precision").reshape(-1, 2)
    y = heads.dnll("renormalise").reshape(-1, 2)
    for k in range(2):
        assert corr.rho[k].item() == pytest.approx(reference_spearman(x[:, k].tolist(), y[:, k].tolist()), abs=1e-12)
    assert bool((corr.low <= corr.high).all())
    with pytest.raises(GeometryError, match="do not pair"):
        geometry_vs_dnll(geometry, intervention_sweep(model, tokens[:2], [2, 4], scope="head", modes=("renormalise",),
                                                      controls=0, **QUIET))
    sweep = intervention_sweep(model, tokens, [1, 2], controls=2, **QUIET)
    figures = intervention_figures(sweep, None, corr)
    page = write_report(geometry, tmp_path, extra_figures=figures).read_text()
    assert 'id="section-interventions-dnll"' in page and 'id="section-interventions-geometry"' in page


@pytest.mark.parametrize("scope", ["model", "layer"])
def test_settings_stacked_in_one_pass_give_the_same_sweep(model, tokens, scope):
    """Several (mode, N, control) settings per forward pass, along the batch: each slice gets its own edit.

    Mutants caught: every slice edited with the first setting's hook (the dNLL of other N and controls change);
    slices put back in another order.
    """
    kwargs = dict(n_grid=[1, 2, 5], scope=scope, layers=[0, 1], controls=2, **QUIET)
    alone = intervention_sweep(model, tokens, **kwargs)
    for per_pass in (2, 4, 100):
        stacked = intervention_sweep(model, tokens, settings_per_pass=per_pass, **kwargs)
        for name, s in alone.stats.items():
            for statistic, x in s.stored().arrays().items():
                y = stacked.stats[name].stored().arrays()[statistic]
                torch.testing.assert_close(y, x, equal_nan=True, rtol=1e-5, atol=1e-7, msg=f"{per_pass} {name}/{statistic}")


@pytest.mark.parametrize("per_pass", [1, 3])
def test_each_control_is_ranked_once_and_gives_the_sweep_ranked_every_pass(model, tokens, per_pass, monkeypatch):
    """A random control's order is kept across its N and modes (the sweep's cache), with the same result as ranking
    it in every pass. Mutants caught: the cache keyed without the control or without the layer (one order serves
    several, so the dNLL change); a control's order dropped while its settings still run (ranked twice)."""
    import tl_geometry.interventions.topn_attention as interventions

    drawn = []
    original = interventions.random_scores

    def counting(shape, **kwargs):
        drawn.append((kwargs["layer"], kwargs["control"]))
        return original(shape, **kwargs)

    monkeypatch.setattr(interventions, "random_scores", counting)
    kwargs = dict(n_grid=[1, 2, 5], layers=[0, 1], controls=3, settings_per_pass=per_pass, **QUIET)
    cached = intervention_sweep(model, tokens, batch_size=len(tokens), **kwargs)
    assert sorted(drawn) == [(layer, control) for layer in (0, 1) for control in (1, 2, 3)]
    drawn.clear()
    ranked = intervention_sweep(model, tokens, batch_size=len(tokens), control_cache_mib=0, **kwargs)
    assert len(drawn) == 2 * 3 * 2 * 3  # layers x controls x modes x N: every pass ranks
    for name, s in ranked.stats.items():
        for statistic, x in s.stored().arrays().items():
            torch.testing.assert_close(cached.stats[name].stored().arrays()[statistic], x, equal_nan=True, rtol=0, atol=0)
    with pytest.raises(GeometryError, match=r"control_cache_mib: expected a finite memory budget in MiB >= 0"):
        intervention_sweep(model, tokens, control_cache_mib=-1, **kwargs)


def test_settings_per_pass_is_checked():
    with pytest.raises(GeometryError, match=r"settings_per_pass: expected an integer >= 1, got 0"):
        intervention_sweep(make_model("bridge-llama"), with_bos(random_tokens(1, 6)), [1], settings_per_pass=0)
