"""Top-N interventions: the hook, its exactness, controls, visibility, and the once-per-model check.

References here are written from the definitions (keep the N keys of largest
score among those the query sees, ties to the earlier key; delete or
renormalise), row by row in plain Python, never with the package's helpers.
Mutants each test catches are named in its docstring.
"""

import contextlib
import math

import pytest
import torch

from tests.tiny_models import (
    KINDS,
    has_hooked_transformer,
    make_model,
    random_tokens,
    tl_major_version,
    with_bos,
)
from tl_geometry.interventions.topn_attention import (
    check_pattern_edits,
    random_scores,
    topn_hooks,
    topn_pattern_hook,
)
from tl_geometry.errors import GeometryError

pytestmark = pytest.mark.model


def available_kinds():
    return [k for k in KINDS if k != "hooked" or has_hooked_transformer()]


def reference_keep(scores, visible, n):
    """Top-N per row by sorting (-score, key index) over visible keys, in plain Python."""
    keep = torch.zeros_like(visible)
    for row in range(scores.shape[0]):
        candidates = [k for k in range(scores.shape[1]) if visible[row, k]]
        if len(candidates) <= n:
            continue
        ranked = sorted(candidates, key=lambda k: (-float(scores[row, k]), k))
        for k in ranked[:n]:
            keep[row, k] = True
    return keep


def reference_edit(pattern, scores, visible, n, mode):
    """The edited pattern ``[batch, head, q, k]`` row by row; ``visible`` is ``[batch, q, k]``."""
    out = pattern.clone()
    for b in range(pattern.shape[0]):
        for h in range(pattern.shape[1]):
            for q in range(pattern.shape[2]):
                seen = visible[b, q]
                if int(seen.sum()) <= n:
                    continue
                keep = reference_keep(scores[b, h, q][None], seen[None], n)[0]
                row = torch.where(keep, pattern[b, h, q], torch.zeros(()).to(pattern.dtype))
                out[b, h, q] = row / row.sum() if mode == "renormalise" else row
    return out


def causal(n_batch, n_pos):
    return torch.ones(n_pos, n_pos, dtype=torch.bool).tril().expand(n_batch, n_pos, n_pos)


def random_pattern(n_batch=2, n_heads=3, n_pos=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(n_batch, n_heads, n_pos, n_pos, generator=gen, dtype=torch.float64)
    scores = scores.masked_fill(~causal(n_batch, n_pos)[:, None], -math.inf)
    return scores.softmax(-1)


@pytest.mark.parametrize("mode", ["renormalise", "delete"])
@pytest.mark.parametrize("n", [1, 2, 3, 6, 7, 10])
def test_hook_matches_reference_edit(mode, n):
    """Mutants caught: rows with N or fewer keys edited; renormalising in delete mode; ties or order reversed."""
    pattern = random_pattern()
    got = topn_pattern_hook(n, mode)(pattern)
    assert torch.equal(got, reference_edit(pattern, pattern, causal(2, 7), n, mode))
    edited = causal(2, 7).sum(-1)[:, None, :].expand(2, 3, 7) > n
    if mode == "renormalise":
        assert torch.allclose(got.sum(-1)[edited], torch.ones(()).double(), atol=1e-12)
    else:
        kept = got != 0
        assert torch.equal(got[kept], pattern[kept])  # kept weights unchanged
        assert bool((kept.sum(-1)[edited] == n).all())
    assert torch.equal(got[~edited], pattern[~edited])  # rows that see N keys or fewer: bit-identical


def test_ties_go_to_the_earlier_key():
    """Mutant caught: an unstable or ascending sort (keeps the later of equal weights)."""
    pattern = torch.tensor([[[[0.25, 0.25, 0.25, 0.25]]]])
    assert topn_pattern_hook(2, "delete")(pattern).tolist() == [[[[0.25, 0.25, 0.0, 0.0]]]]
    assert topn_pattern_hook(1, "renormalise")(pattern).tolist() == [[[[1.0, 0.0, 0.0, 0.0]]]]


def test_padding_and_window_keys_are_never_kept():
    """Mutants caught: ignoring attention_mask, ignoring the window (a heavy hidden key would be kept)."""
    # One query row at position 4 of 5; key 0 is padding, the window of 2 hides keys 0..2.
    pattern = torch.tensor([[[[0.0] * 5] * 4 + [[0.5, 0.3, 0.1, 0.06, 0.04]]]])
    mask = torch.tensor([[0, 1, 1, 1, 1]])
    got = topn_pattern_hook(1, "delete", attention_mask=mask)(pattern)[0, 0, 4]
    assert got.tolist() == pytest.approx([0.0, 0.3, 0.0, 0.0, 0.0])
    got = topn_pattern_hook(1, "renormalise", window=2)(pattern)[0, 0, 4]
    assert got.tolist() == pytest.approx([0.0, 0.0, 0.0, 1.0, 0.0])
    # A row that sees only the window's 2 keys is unchanged at N = 2 even though 5 are causal.
    assert torch.equal(topn_pattern_hook(2, "delete", window=2)(pattern), pattern)


def test_heads_not_chosen_are_unchanged():
    pattern = random_pattern()
    got = topn_pattern_hook(1, "delete", heads=[1])(pattern)
    assert torch.equal(got[:, [0, 2]], pattern[:, [0, 2]])
    assert not torch.equal(got[:, 1], pattern[:, 1])


def test_contribution_ranking_reads_hook_v():
    """Mutant caught: ranking by attention alone under ranking='contribution'."""
    pattern = torch.tensor([[[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.3, 0.2]]]])
    values = torch.zeros(1, 3, 1, 2)
    values[0, :, 0, 0] = torch.tensor([1.0, 1.0, 10.0])  # key 2: small weight, big value
    hook = topn_pattern_hook(1, "delete", "contribution")
    with pytest.raises(GeometryError, match="attach hook.value_hook to blocks.0.attn.hook_v"):
        hook(pattern)
    hook.value_hook(values)
    assert hook(pattern)[0, 0, 2].tolist() == pytest.approx([0.0, 0.0, 0.2])


def test_random_controls_are_seeded_and_nested():
    """Mutant caught: fresh random scores per N (sets would not nest), an unseeded generator."""
    pattern = random_pattern(n_pos=9)
    visible = causal(2, 9)[:, None].expand(pattern.shape)
    kept = [topn_pattern_hook(n, "delete", "random", control=3, seed=1)(pattern) != 0 for n in range(1, 9)]
    for smaller, larger in zip(kept, kept[1:]):
        assert bool((smaller & ~larger).sum() == 0)  # top-N inside top-(N+1)
    scores = random_scores(pattern.shape, seed=1, control=3, layer=0)
    assert torch.equal(kept[2], reference_keep(scores.flatten(0, 2), visible.flatten(0, 2), 3).reshape(pattern.shape)
                       | (~(visible.sum(-1, keepdim=True) > 3) & (pattern != 0)))
    other = topn_pattern_hook(3, "delete", "random", control=4, seed=1)(pattern) != 0
    assert not torch.equal(other, kept[2])  # controls differ


def test_random_control_of_a_document_does_not_depend_on_its_batch():
    """Mutant caught: scores drawn over the batch's shape (a padded or wider batch would reshuffle them)."""
    alone = random_scores((1, 2, 5, 5), seed=0, control=1, layer=3, row_seeds=torch.tensor([7]))
    padded = random_scores((2, 2, 8, 8), seed=0, control=1, layer=3, row_seeds=torch.tensor([9, 7]),
                           first_real=torch.tensor([0, 3]))  # row 1: 3 pads on the left
    assert torch.equal(padded[1, :, 3:, 3:], alone[0])
    assert not torch.equal(padded[0, :, :5, :5], alone[0])


def test_bad_arguments_raise():
    with pytest.raises(GeometryError, match="n: expected a positive integer"):
        topn_pattern_hook(0)
    with pytest.raises(GeometryError, match="mode: expected one of"):
        topn_pattern_hook(1, "zero")
    with pytest.raises(GeometryError, match="ranking: expected one of"):
        topn_pattern_hook(1, ranking="nearest")


@pytest.mark.parametrize("kind", available_kinds())
@pytest.mark.parametrize("mode", ["renormalise", "delete"])
def test_n_at_least_the_visible_keys_leaves_logits_bit_identical(kind, mode):
    """Mutant caught: editing rows that see N keys or fewer (renormalising a full row changes bits)."""
    model = make_model(kind)
    tokens = with_bos(random_tokens(2, 9))
    clean = model(tokens)
    with model.hooks(fwd_hooks=topn_hooks(model, tokens.shape[1], mode=mode)):
        same = model(tokens)
    with model.hooks(fwd_hooks=topn_hooks(model, 2, mode=mode)):
        changed = model(tokens)
    assert torch.equal(same, clean)
    assert not torch.equal(changed, clean)
    assert all(not getattr(m, "fwd_hooks", None) for m in model.modules())


def test_hooks_removed_after_an_error():
    model = make_model("bridge-llama")
    tokens = with_bos(random_tokens(1, 5))
    hooks = topn_hooks(model, 1, ranking="contribution")
    hooks = [h for h in hooks if "hook_v" not in h[0]]  # no value states: the pattern hook raises
    with pytest.raises(GeometryError), model.hooks(fwd_hooks=hooks):
        model(tokens)
    assert all(not getattr(m, "fwd_hooks", None) for m in model.modules())


def test_layer_one_ranks_the_pattern_changed_by_layer_zero():
    """The selection is recomputed in the intervened pass: layer 1 keeps the top-N of its *new* pattern.

    Mutant caught: a hook that ranks the clean pattern (cached from an earlier pass).
    """
    model = make_model("bridge-llama")
    tokens = with_bos(random_tokens(2, 12))
    seen = {}

    def record(name):
        def fn(pattern, *, hook):
            seen[name] = pattern.detach().clone()
        return fn

    with model.hooks(fwd_hooks=[("blocks.1.attn.hook_pattern", record("clean"))]):
        model(tokens)
    hooks = topn_hooks(model, 2, mode="renormalise")
    hooks.insert(2, ("blocks.1.attn.hook_pattern", record("before")))  # runs before layer 1's top-N hook
    hooks.append(("blocks.1.attn.hook_pattern", record("after")))
    with model.hooks(fwd_hooks=hooks):
        model(tokens)
    visible = causal(2, 13)
    assert not torch.allclose(seen["before"], seen["clean"])  # layer 0's edit reached layer 1
    expected = reference_edit(seen["before"], seen["before"], visible, 2, "renormalise")
    assert torch.allclose(seen["after"], expected, atol=1e-12)
    kept_now = seen["after"] != 0
    kept_clean = reference_edit(seen["clean"], seen["clean"], visible, 2, "renormalise") != 0
    assert not torch.equal(kept_now, kept_clean)  # the top-N sets differ from the clean ranking's


class _DiscardingModel:
    """A model whose hooks fire after the fact: edits never reach the logits (as some 4.x adapters)."""

    class cfg:
        n_layers, d_vocab, model_name, device = 2, 8, "post-hoc-toy", None

    def hooks(self, fwd_hooks=()):
        return contextlib.nullcontext()

    def __call__(self, tokens):
        return torch.zeros(*tokens.shape, 8)


def test_check_pattern_edits_names_the_model_and_the_fix():
    """Mutant caught: a check that passes without comparing logits."""
    with pytest.raises(GeometryError, match=r"post-hoc-toy.*layers \[0, 1\].*compatibility_mode"):
        check_pattern_edits(_DiscardingModel())
    for kind in available_kinds():
        check_pattern_edits(make_model(kind))  # every supported kind passes


class _DiscardingLayerOne(_DiscardingModel):
    """Edits of layer 0 reach the logits, those of layer 1 do not; counts the passes each layer's check costs."""

    class cfg(_DiscardingModel.cfg):
        model_name = "layer-one-toy"

    def __init__(self):
        self.hooked, self.checked = (), []

    @contextlib.contextmanager
    def hooks(self, fwd_hooks=()):
        self.hooked = tuple(name for name, _ in fwd_hooks)
        self.checked += self.hooked
        yield
        self.hooked = ()

    def __call__(self, tokens):
        return torch.full((*tokens.shape, 8), float("blocks.0.attn.hook_pattern" in self.hooked))


def test_check_pattern_edits_checks_the_layers_asked_for_once():
    model = _DiscardingLayerOne()
    check_pattern_edits(model, [0])
    check_pattern_edits(model, [0])  # already checked: no pass
    assert model.checked == ["blocks.0.attn.hook_pattern"]
    with pytest.raises(GeometryError, match=r"layer-one-toy.*hook_pattern does not change the logits on layers \[1\]"):
        check_pattern_edits(model)  # every layer: layer 1 is checked now, and refused
    assert model.checked == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    with pytest.raises(GeometryError, match=r"on layers \[1\]"):
        check_pattern_edits(model, [1])  # a refused layer is not remembered as checked
    model = _DiscardingLayerOne()
    with pytest.raises(GeometryError):
        topn_hooks(model, 1, mode="delete", layers=[1])  # the hooks of an intervention check their own layers
    assert model.checked == ["blocks.1.attn.hook_pattern"]


@pytest.mark.skipif(tl_major_version() < 4, reason="the TransformerBridge of transformer-lens 4.x")
def test_bridge_4x_without_compatibility_mode_reaches_the_logits():
    check_pattern_edits(make_model("bridge-llama"))
