"""Head ablations by role (`ablate_roles`) and the published measures beside the roles (`published_measures`).

References are written from the definitions, never with the package's helpers:
zero-ablation is zeroing the head's rows of W_O in a fresh copy of the model;
mean-ablation is the same plus the head's mean output moved into the output
bias; the sink score and the output norms are loops over one sequence at a
time through ``run_with_cache``. Mutants each test catches are named in its docstring.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tiny_models import KINDS, has_hooked_transformer, hook_counts, make_model, random_tokens, with_bos
from tl_geometry.analysis.role_ablation import (
    ROLE_LABELS,
    HeadGroup,
    bootstrap_interval,
    random_head_sets,
    role_groups,
)
from tl_geometry.errors import GeometryError
from tl_geometry.interventions import head_ablation as ablation_module
from tl_geometry.interventions.head_ablation import ablate_roles, ablation_hooks, mean_z
from tl_geometry.roles.published import published_measures

pytestmark = pytest.mark.model


def available_kinds():
    return [k for k in KINDS if k != "hooked" or has_hooked_transformer()]


class FakeTaxonomy:
    """The stable part of HeadRoles: layers, heads, label_names(), subtype()."""

    def __init__(self, labels, subtypes=None, layers=(0, 1), heads=(0, 1, 2, 3)):
        self.layers, self.heads = tuple(layers), tuple(heads)
        self._labels, self._subtypes = labels, dict(subtypes or {})

    def label_names(self):
        return [list(row) for row in self._labels]

    def subtype(self, layer, head):
        return self._subtypes.get((layer, head))


def taxonomy_of(retrievers, subtypes=None):
    labels = [["retriever" if (layer, head) in retrievers else "reset" for head in range(4)] for layer in range(2)]
    return FakeTaxonomy(labels, subtypes)


def w_o_rows_zeroed(kind, heads, shift=None):
    """A fresh tiny model of ``kind`` whose W_O rows of ``heads`` are zero (and, with ``shift``, the heads' mean
    output ``means[l, h] @ W_O[h]`` added to that layer's output bias)."""
    model = make_model(kind)
    d = int(model.cfg.d_head)
    with torch.no_grad():
        for layer, head in heads:
            if kind == "hooked":
                w_o, bias = model.blocks[layer].attn.W_O, model.blocks[layer].attn.b_O
                if shift is not None:
                    bias += shift[layer, head].to(w_o.dtype) @ w_o[head]
                w_o[head] = 0
                continue
            o = model.blocks[layer].attn.o
            linear = getattr(o, "_original_component", o)
            if isinstance(linear, torch.nn.Linear):  # [d_model, n_heads * d_head]
                rows = linear.weight[:, head * d : (head + 1) * d]
                if shift is not None:
                    linear.bias += rows @ shift[layer, head].to(rows.dtype)
                rows.zero_()
            else:  # GPT-2's Conv1D: [n_heads * d_head, d_model]
                rows = linear.weight[head * d : (head + 1) * d]
                if shift is not None:
                    linear.bias += shift[layer, head].to(rows.dtype) @ rows
                rows.zero_()
    return model


@pytest.mark.parametrize("kind", available_kinds())
def test_zero_ablation_through_hook_z_equals_zeroed_w_o_rows(kind):
    """Mutants: ablating head h + 1 (or h - 1) instead of h; ablating only the first position; the wrong layer."""
    model = make_model(kind)
    tokens = with_bos(random_tokens(2, 12))
    heads = [(0, 1), (1, 2), (1, 3)]
    with torch.no_grad(), model.hooks(fwd_hooks=ablation_hooks(heads, "zero")):
        ablated = model(tokens)
    with torch.no_grad():
        reference = w_o_rows_zeroed(kind, heads)(tokens)
        clean = model(tokens)
    torch.testing.assert_close(ablated, reference, rtol=1e-9, atol=1e-9)
    assert not torch.allclose(ablated, clean)


@pytest.mark.parametrize("kind", [k for k in available_kinds() if k in ("hooked", "bridge-gpt2")])  # an output bias
def test_mean_ablation_equals_the_mean_moved_into_the_output_bias(kind):
    """Mutants: the mean of another head; zeros instead of the mean; the mean over the evaluated tokens."""
    model = make_model(kind)
    tokens, calibration = with_bos(random_tokens(2, 12, seed=1)), with_bos(random_tokens(3, 12, seed=2))
    means = mean_z(model, calibration)
    heads = [(0, 2), (1, 0)]
    with torch.no_grad(), model.hooks(fwd_hooks=ablation_hooks(heads, "mean", means)):
        ablated = model(tokens)
    # The reference mean: every z of the calibration windows, from the cache, averaged by hand.
    _, cache = model.run_with_cache(calibration)
    reference_means = torch.stack([cache[f"blocks.{layer}.attn.hook_z"].reshape(-1, 4, 8).mean(0) for layer in range(2)])
    torch.testing.assert_close(means.to(reference_means.dtype), reference_means, rtol=1e-9, atol=1e-9)
    with torch.no_grad():
        reference = w_o_rows_zeroed(kind, heads, shift=reference_means)(tokens)
    torch.testing.assert_close(ablated, reference, rtol=1e-8, atol=1e-8)


def test_a_groups_row_is_the_reference_change_in_loss():
    """The table's zero-ablation change for a group is the NLL of the zeroed-W_O model minus the clean NLL.

    Mutants: the wrong head index in the hook; the random sets' losses in the group's place; the loss from the
    wrong position (an off-by-one in the targets); the zero rows given the means when both ablations run.
    """
    model = make_model("bridge-llama")
    tokens, calibration = with_bos(random_tokens(4, 15, seed=3)), with_bos(random_tokens(2, 15, seed=4))
    retrievers = [(0, 3), (1, 1)]
    result = ablate_roles(model, taxonomy_of(retrievers), tokens=tokens, mean_tokens=calibration,
                          n_random=3, repeated_prompts=0, detectors=False, progress=False, n_bootstrap=50)
    row = next(r for r in result.rows if r.group == "role retriever" and r.ablation == "zero")
    mean_row = next(r for r in result.rows if r.group == "role retriever" and r.ablation == "mean")
    assert mean_row.dnll != pytest.approx(row.dnll, rel=1e-3)  # zero rows must not be mean-ablated (a bug once)

    def nll(logits):
        logp = torch.log_softmax(logits.double(), -1)
        return -logp[:, :-1].gather(-1, tokens[:, 1:, None]).squeeze(-1).mean(-1)

    with torch.no_grad():
        want = (nll(w_o_rows_zeroed("bridge-llama", retrievers)(tokens)) - nll(model(tokens))).mean()
    assert row.dnll == pytest.approx(float(want), rel=1e-6, abs=1e-9)
    assert row.n_heads == 2 and row.layers == "0:1, 1:1" and row.n_random == 3
    assert row.low <= row.dnll <= row.high
    assert row.random_low <= row.random_high


def test_role_groups_follow_the_labels_and_the_subtypes():
    taxonomy = taxonomy_of([(0, 0), (1, 2)], subtypes={(0, 1): "previous-token", (1, 3): "previous-token",
                                                        (1, 0): "secondary sink 3"})
    groups = {g.name: g for g in role_groups(taxonomy)}
    assert groups["role retriever"].heads == ((0, 0), (1, 2))
    assert len(groups["role reset"].heads) == 6
    assert groups["subtype previous-token"].heads == ((0, 1), (1, 3))
    assert groups["subtype previous-token"].tasks == ("natural", "repeated")
    assert groups["subtype secondary sink 3"].tasks == ("natural",)
    assert set(groups) == {"role retriever", "role reset", "subtype previous-token", "subtype secondary sink 3"}
    assert [g.name for g in role_groups(taxonomy, min_heads=2)] == ["role retriever", "role reset",
                                                                    "subtype previous-token"]
    assert [g.name for g in role_groups(taxonomy, min_heads=3)] == ["role retriever", "role reset"]  # roles stay
    mixed = FakeTaxonomy([["uncertain", "reset", "reset", "reset"], ["reset"] * 4])
    assert [g.name for g in role_groups(mixed)] == ["role reset", "role uncertain"]
    assert [g.name for g in role_groups(mixed, uncertain=False)] == ["role reset"]


@st.composite
def groups_and_layers(draw):
    n_layers = draw(st.integers(1, 6))
    available = {layer: sorted(draw(st.sets(st.integers(0, 15), min_size=1, max_size=10))) for layer in range(n_layers)}
    group = []
    for layer, heads in available.items():
        group += [(layer, h) for h in draw(st.sets(st.sampled_from(heads), max_size=len(heads)))]
    return sorted(group) or [(0, available[0][0])], available


@settings(max_examples=60, deadline=None)
@given(groups_and_layers(), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_random_sets_have_the_groups_size_and_layer_distribution(case, n_draws, seed):
    """Mutants: drawing from every layer; drawing with replacement; one head fewer or more in a layer."""
    group, available = case
    draws = random_head_sets(group, available, n_draws, seed)
    assert len(draws) == n_draws
    want = sorted(layer for layer, _ in group)
    for heads in draws:
        assert len(heads) == len(group) and len(set(heads)) == len(heads)
        assert sorted(layer for layer, _ in heads) == want
        assert all(head in available[layer] for layer, head in heads)
    assert draws == random_head_sets(group, available, n_draws, seed)  # seeded


def test_random_sets_vary_between_draws():
    available = {0: list(range(9)), 1: list(range(9))}
    draws = random_head_sets([(0, 0), (0, 1), (1, 5)], available, 20, seed=0)
    assert len(set(draws)) > 10


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=30), st.integers(0, 1000))
def test_the_bootstrap_interval_contains_the_point_estimate(values, seed):
    """Mutants: an interval of the resampled values instead of their means; a level's tails swapped."""
    data = torch.tensor(values, dtype=torch.float64)
    low, high = bootstrap_interval(data, 400, seed)
    mean = float(data.mean())
    assert low - 1e-12 <= mean <= high + 1e-12
    assert (low, high) == bootstrap_interval(data, 400, seed)


def test_the_bootstrap_interval_narrows_with_more_documents():
    generator = torch.Generator().manual_seed(0)
    few, many = torch.randn(8, generator=generator, dtype=torch.float64), torch.randn(800, generator=generator,
                                                                                        dtype=torch.float64)
    width = lambda v: (lambda lo_hi: lo_hi[1] - lo_hi[0])(bootstrap_interval(v, 500, 0))  # noqa: E731
    assert width(many) < width(few) / 4


def test_the_model_is_left_as_it_was_after_an_error(monkeypatch):
    """An error in the middle of the run leaves no hook and no changed weight.

    Mutants: hooks added with add_hook outside a context; weights zeroed in place to ablate.
    """
    model = make_model("bridge-llama")
    tokens, calibration = with_bos(random_tokens(3, 10, seed=5)), with_bos(random_tokens(2, 10, seed=6))
    before_hooks = hook_counts(model)
    before = {name: p.detach().clone() for name, p in model.state_dict().items()}
    original, calls = ablation_module.document_losses, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise GeometryError("stop here")
        return original(*args, **kwargs)

    monkeypatch.setattr(ablation_module, "document_losses", failing)
    with pytest.raises(GeometryError, match="stop here"):
        ablate_roles(model, taxonomy_of([(0, 0)]), tokens=tokens, mean_tokens=calibration, n_random=2,
                     repeated_prompts=0, detectors=False, progress=False)
    assert hook_counts(model) == before_hooks
    after = model.state_dict()
    assert all(torch.equal(after[name], value) for name, value in before.items())


def test_bad_input_raises_naming_the_fix():
    model = make_model("bridge-llama")
    tokens, calibration = with_bos(random_tokens(2, 10)), with_bos(random_tokens(2, 10, seed=9))
    taxonomy = taxonomy_of([(0, 0)])
    common = dict(tokens=tokens, mean_tokens=calibration, repeated_prompts=0, detectors=False, progress=False)
    with pytest.raises(GeometryError, match=r"ablations: expected a non-empty selection of \('zero', 'mean'\)"):
        ablate_roles(model, taxonomy, ablations=("resample",), **common)
    with pytest.raises(GeometryError, match="the mean z must come from windows that are not evaluated"):
        ablate_roles(model, taxonomy, tokens=tokens, mean_tokens=tokens[:1], progress=False)
    with pytest.raises(GeometryError, match="mean_tokens: required with your own tokens"):
        ablate_roles(model, taxonomy, tokens=tokens, progress=False)
    with pytest.raises(GeometryError, match="n_random: expected an integer >= 2"):
        ablate_roles(model, taxonomy, n_random=1, **common)
    wrong = FakeTaxonomy([["reset"] * 9] * 30, layers=range(30), heads=range(9))
    with pytest.raises(GeometryError, match=r"do not exist in model .*2 layers x 4 heads.*classify the heads of this model"):
        ablate_roles(model, wrong, **common)
    with pytest.raises(GeometryError, match="expected a HeadRoles"):
        ablate_roles(model, object(), **common)
    with pytest.raises(GeometryError, match="means: mean-ablation needs each head's mean z"):
        ablation_hooks([(0, 1)], "mean")
    with pytest.raises(GeometryError, match="exceed the model's context"):
        ablate_roles(model, taxonomy, tokens=tokens, mean_tokens=calibration, period=40, progress=False)


def test_the_tasks_detectors_and_table_on_a_classified_tiny_model():
    import tl_geometry as tg

    model = make_model("bridge-gpt2")
    tokens = with_bos(random_tokens(6, 20, seed=7))
    taxonomy = tg.classify_heads(model, tokens[:4])
    from tl_geometry.interventions import ablate_roles as public_ablate_roles

    result = public_ablate_roles(model, taxonomy, tokens=tokens[:4], mean_tokens=tokens[4:], n_random=2,
                             repeated_prompts=2, period=8, detector_threshold=0.05, progress=False, n_bootstrap=20)
    frame = result.to_dataframe()
    assert set(frame["task"]) <= {"natural", "repeated"} and set(frame["ablation"]) == {"zero", "mean"}
    assert {g.kind for g in result.groups} >= {"role"}
    for group in result.groups:  # each group has one row per task it is measured on and ablation
        assert sum(1 for r in result.rows if r.group == group.name) == 2 * len(group.tasks)
    assert all(r.low <= r.dnll <= r.high for r in result.rows)
    assert "| group | heads | task |" in result.to_markdown()
    from tl_geometry.report.ablation_figure import ablation_figure

    figure = ablation_figure(result)
    assert len(figure.data) >= 2


# ---- the published measures, against loops over single sequences ----


def reference_measures(model, tokens, epsilon, threshold, space):
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    scores = torch.zeros(tokens.shape[0], n_layers, n_heads, dtype=torch.float64)
    norms = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    for s in range(tokens.shape[0]):
        _, cache = model.run_with_cache(tokens[s : s + 1])
        for layer in range(n_layers):
            pattern, z = cache[f"blocks.{layer}.attn.hook_pattern"][0], cache[f"blocks.{layer}.attn.hook_z"][0]
            for head in range(n_heads):
                queries = pattern.shape[-2]
                scores[s, layer, head] = sum(float(pattern[head, q, 0]) for q in range(queries)) / queries
                for position in range(z.shape[0]):
                    out = z[position, head].double()
                    if space == "result":
                        out = out @ model.blocks[layer].attn.W_O[head].double()
                    norms[layer, head] += float(out.pow(2).sum().sqrt())
    norms /= tokens.numel()
    ratio = norms / norms.mean(-1, keepdim=True)
    rate = sum(float(v > epsilon) for v in scores.flatten().tolist()) / scores.numel()
    return scores.mean(0), rate, norms, ratio, ratio < threshold


@pytest.mark.parametrize("kind", available_kinds())
@pytest.mark.parametrize("space", ["z", "result"])
def test_published_measures_match_the_definitions(kind, space):
    """Mutants: the score over queries after the first only; the last key instead of the first; the global mean norm
    instead of the layer's; the norm of the mean output instead of the mean of the norms."""
    model = make_model(kind)
    tokens = with_bos(random_tokens(3, 9, seed=11))
    found = published_measures(model, tokens, epsilon=0.2, dormant_threshold=0.9, space=space, batch_size=2)
    score, rate, norms, ratio, dormant = reference_measures(model, tokens, 0.2, 0.9, space)
    torch.testing.assert_close(found.first_token_score, score, rtol=1e-9, atol=1e-9)
    assert found.sink_rate == pytest.approx(rate)
    torch.testing.assert_close(found.output_norm, norms, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(found.norm_ratio, ratio, rtol=1e-9, atol=1e-9)
    assert torch.equal(found.dormant_heads, dormant)
    assert torch.equal(found.sink_heads, score > 0.2)


def test_crosstab_counts_each_role_among_sink_and_dormant_heads():
    model = make_model("bridge-llama")
    tokens = with_bos(random_tokens(3, 9, seed=12))
    found = published_measures(model, tokens, epsilon=0.15, dormant_threshold=1.0)
    taxonomy = taxonomy_of([(0, 0), (0, 1), (1, 3)])
    table = found.crosstab(taxonomy)
    names = taxonomy.label_names()
    for key, flags in (("sink", found.sink_heads), ("dormant", found.dormant_heads)):
        for label in ROLE_LABELS:
            want = sum(1 for i in range(2) for j in range(4) if names[i][j] == label and bool(flags[i, j]))
            assert table[key][label] == want
    assert sum(table["all"].values()) == 8 and 0 < sum(table["dormant"].values()) < 8
    with pytest.raises(GeometryError, match="measure the heads the roles classified"):
        found.crosstab(FakeTaxonomy([["reset"] * 4], layers=(0,)))


def test_published_measures_refuse_bad_thresholds():
    model = make_model("bridge-llama")
    tokens = with_bos(random_tokens(2, 6))
    with pytest.raises(GeometryError, match=r"epsilon: expected a threshold in \(0, 1\)"):
        published_measures(model, tokens, epsilon=1.5)
    with pytest.raises(GeometryError, match="space: expected one of"):
        published_measures(model, tokens, space="v")
    assert math.isclose(published_measures(model, tokens).epsilon, 0.3)  # Gu et al.'s epsilon is the default


def test_group_layer_counts():
    assert HeadGroup("g", "role", ((0, 1), (0, 2), (3, 0))).layer_counts() == {0: 2, 3: 1}


def test_intervene_ablate_roles_writes_the_table_and_the_figure(tmp_path, monkeypatch, capsys):
    """``tl-geometry intervene --ablate-roles`` on a tiny model standing in for the default one."""
    import tl_geometry.models as models
    from tl_geometry.cli import main

    tiny = make_model("bridge-llama")
    monkeypatch.setattr(models, "load_model", lambda *args, **kwargs: tiny)
    before = hook_counts(tiny)
    out = tmp_path / "run"
    code = main(["intervene", "--ablate-roles", "--windows", "2", "--context", "16", "--random-sets", "2",
                 "--bootstrap", "4", "--quiet", "--out", str(out)])
    assert code == 0
    frame = __import__("pandas").read_csv(out / "ablation.csv")
    assert {"group", "task", "ablation", "dnll", "low", "high", "random_low", "random_high"} <= set(frame.columns)
    page = (out / "ablation.html").read_text()
    assert page.count("random band") >= 1
    # The ablations sit inside the roles they test, after the role counts and before the list of every head.
    assert page.index("<section id='head-roles'>") < page.index("<section id='role-ablations'>") < page.index(
        "<summary>Every head</summary>")
    assert "| group | heads | task |" in (out / "ablation.md").read_text()
    assert "ablation.csv" in capsys.readouterr().out
    assert hook_counts(tiny) == before
    with pytest.raises(SystemExit):
        main(["intervene", "--ablate-roles", "--random-sets", "x"])
    assert main(["intervene", "--ablate-roles", "--random-sets", "1", "--quiet", "--out", str(out)]) == 1
    assert "--random-sets: expected at least 2" in capsys.readouterr().err


def test_the_mean_comes_from_the_windows_after_the_evaluated_ones(monkeypatch):
    """Mutant: the mean z estimated on the evaluated windows (or on all of them)."""
    import tl_geometry as tg
    from tests.fixtures import spy

    model = make_model("bridge-llama")
    calls = spy(monkeypatch, ablation_module, "mean_z")
    ablate_roles(model, taxonomy_of([(1, 2)]), n_windows=2, context=16, mean_windows=3, n_random=2, repeated_prompts=0,
                 detectors=False, progress=False, n_bootstrap=10)
    windows = tg.text_windows(model, tg.default_text(), context=16, n_windows=5)
    (args, _), = calls
    assert torch.equal(args[1], windows[2:])
