"""run_with_geometry_hooks on tiny random models of every kind, against the slow run_with_cache way."""

import functools

import pytest
import torch

from tests import tiny_models as tm
from tl_geometry.config import GeometryConfig
from tl_geometry.results.result import GeometryResult
from tl_geometry.errors import GeometryError
from tl_geometry.capture.hook_names import pattern_hook, value_hook, z_hook
from tl_geometry.capture.hooks import run_with_geometry_hooks
from tl_geometry.capture.plan import kv_head_of
from tl_geometry.engine.metrics import selection_metrics

# Model-facing: also run in the transformer-lens 3.9 environment (make test-tl3).
pytestmark = pytest.mark.model

needs_hooked = [pytest.mark.tl3, pytest.mark.skipif(not tm.has_hooked_transformer(), reason="needs transformer-lens 3.x")]
KIND_PARAMS = [pytest.param("hooked", marks=needs_hooked), "bridge-gpt2", "bridge-llama", "compat-llama"]
TEXTS = [
    "the cat sat on the mat and ran",
    "a dog",
    "one two three four five six seven eight nine ten house tree",
    "big red sun",
]


@pytest.fixture(scope="module", params=KIND_PARAMS)
def model(request):
    return tm.make_model(request.param)


def top_n_mass(alpha: torch.Tensor, values: torch.Tensor, grid, ranking: str) -> torch.Tensor:
    """The attention on the top-N set, by its definition: the N keys of largest score (ties: smaller index first)."""
    score = alpha if ranking == "attention" else alpha * values.norm(dim=-1)
    out = torch.full((alpha.shape[0], len(grid)), float("nan"), dtype=torch.float64)
    for h in range(alpha.shape[0]):
        order = sorted(range(alpha.shape[1]), key=lambda k: (-score[h, k].item(), k))
        for i, n in enumerate(int(n) for n in grid):
            if n <= alpha.shape[1]:
                out[h, i] = sum(alpha[h, k].item() for k in order[:n])
    return out


def reference(model, rows: list[torch.Tensor], config: GeometryConfig, grid) -> dict[str, torch.Tensor]:
    """The slow way: one unpadded sequence at a time, run_with_cache, the engine per query.

    Returns every metric as ``[sequence, layer, head_index, n]``.
    """
    layers = config.layers or range(model.cfg.n_layers)
    heads = list(config.heads or range(model.cfg.n_heads))
    out: dict[str, list] = {}
    for row in rows:
        names = [value_hook(layer) for layer in layers] + [pattern_hook(layer) for layer in layers]
        _, cache = model.run_with_cache(row.unsqueeze(0), names_filter=lambda n: n in names)
        length = len(row)
        if config.query_positions == "last":
            queries = [length - 1]
        elif config.query_positions == "all":
            queries = list(range(length))
        else:
            queries = list(config.query_positions)
        per_layer: dict[str, list] = {}
        for layer in layers:
            pattern = cache[pattern_hook(layer)][0]  # [head, q, k]
            v = cache[value_hook(layer)][0]  # [pos, kv_head, d_head]
            group = pattern.shape[0] // v.shape[1]
            per_query: dict[str, list] = {}
            for q in queries:
                alpha = pattern[heads, q, : q + 1]  # keys 0..q
                values = torch.stack([v[: q + 1, h // group] for h in heads])
                m = selection_metrics(alpha, values, grid, ranking=config.ranking, distance=config.distance)
                for name, t in m.per_row_fields().items():
                    per_query.setdefault(name, []).append(t)
                per_query.setdefault("attention_mass", []).append(top_n_mass(alpha, values, grid, config.ranking))
            for name, ts in per_query.items():
                per_layer.setdefault(name, []).append(torch.nanmean(torch.stack(ts), dim=0))
        for name, ts in per_layer.items():
            out.setdefault(name, []).append(torch.stack(ts))
    return {name: torch.stack(ts) for name, ts in out.items()}


def per_sequence(result) -> dict[str, torch.Tensor]:
    """Each sequence's nanmean over its analysed queries, ``[sequence, layer, head_index, n]``, from the kept rows.

    The rows are ``result.queries`` (a run with ``keep_queries=True``), NaN where a sequence has no such query.
    """
    return {name: torch.nanmean(rows, dim=3) for name, rows in result.queries.items()}


def assert_metrics_close(per_seq, expected, **close):
    assert set(per_seq) == set(expected)
    for name, want in expected.items():
        torch.testing.assert_close(per_seq[name], want.to(per_seq[name].dtype), equal_nan=True, msg=name, **close)


def expected_query_positions(lengths: list[int], config: GeometryConfig) -> list[list[int]]:
    """The analysed positions of each sequence (counted from its first token), padded with -1."""
    if config.query_positions == "last":
        rows = [[n - 1] for n in lengths]
    elif config.query_positions == "all":
        rows = [list(range(n)) for n in lengths]
    else:
        rows = [list(config.query_positions) for _ in lengths]
    width = max(len(r) for r in rows)
    return [r + [-1] * (width - len(r)) for r in rows]


def token_rows(model, texts, prepend_bos=True):
    return [model.to_tokens(t, prepend_bos=prepend_bos)[0] for t in texts]


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"query_positions": "all", "n_grid": "all"},
        {"query_positions": [0, 2], "n_grid": [1, 2, 3, 5], "layers": [1], "heads": [3, 0]},
        {"ranking": "contribution", "distance": "cosine", "n_grid": [1, 2, 4, 8]},
    ],
)
def test_padded_batch_matches_run_with_cache_one_at_a_time(model, overrides):
    result = run_with_geometry_hooks(model, TEXTS, keep_queries=True, **overrides)
    config = GeometryConfig(**overrides)
    rows = token_rows(model, TEXTS)
    expected = reference(model, rows, config, result.n_grid)
    close = tm.padding_close(model)  # the reference runs each text alone
    assert_metrics_close(per_sequence(result), expected, **close)
    lengths = [len(r) for r in rows]
    assert result.query_positions.tolist() == expected_query_positions(lengths, config)
    assert (result.n_documents, result.n_tokens) == (len(TEXTS), sum(lengths))
    for name, t in expected.items():  # the per-layer-head values are the nanmeans over sequences (documents)
        mean = torch.nanmean(t, 0)
        torch.testing.assert_close(getattr(result, name), mean.to(getattr(result, name).dtype), equal_nan=True, msg=name,
                                   **close)
        assert torch.equal(result.count(name), (~t.isnan()).sum(0)), name


def test_default_grid_reaches_the_visible_keys(model):
    result = run_with_geometry_hooks(model, tm.with_bos(tm.random_tokens(2, 40)))
    grid = result.n_grid.tolist()
    assert grid[:16] == list(range(1, 17)) and grid[-1] == 41 and grid == sorted(set(grid))
    assert not result.precision[..., -1].isnan().any()  # N = visible keys: everything selected
    assert torch.equal(result.precision[..., -1], torch.ones_like(result.precision[..., -1]))


@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_left_padding_with_mask_equals_unpadded(kind):
    # float32: a raw TransformerBridge over Llama in float64 turns fully masked pad rows into NaN
    # that spread to real rows (see test_left_padding_nan_is_reported).
    model = tm.make_model(kind, dtype=torch.float32)
    rows = token_rows(model, TEXTS)
    tokens, mask = tm.left_padded(rows)
    config = GeometryConfig(query_positions="all", n_grid=[1, 2, 3, 4], keep_queries=True)
    result = run_with_geometry_hooks(model, tokens, attention_mask=mask, config=config)
    assert_metrics_close(per_sequence(result), reference(model, rows, config, result.n_grid))
    # Positions count from each sequence's first real token, whatever the padding.
    assert result.query_positions.tolist() == expected_query_positions([len(r) for r in rows], config)


def test_left_padding_nan_is_reported():
    model = tm.make_model("bridge-llama", dtype=torch.float64)
    rows = token_rows(model, TEXTS)
    tokens, mask = tm.left_padded(rows)
    config = GeometryConfig(n_grid=[1, 2, 3], keep_queries=True, capture="pattern")  # the bridge's own attention
    try:
        result = run_with_geometry_hooks(model, tokens, attention_mask=mask, config=config)
    except GeometryError as err:  # what transformer-lens 3.9 and 4.3 do: reported, never analysed wrongly
        assert "blocks.1.attn.hook_pattern: the model returned NaN or Inf attention weights" in str(err)
    else:  # a transformer-lens that handles it must give the unpadded results
        assert_metrics_close(per_sequence(result), reference(model, rows, config, result.n_grid))


def test_batch_composition_does_not_change_results(model):
    together = run_with_geometry_hooks(model, TEXTS, n_grid=[1, 2, 3], keep_queries=True)
    alone = [run_with_geometry_hooks(model, text, n_grid=[1, 2, 3], keep_queries=True) for text in TEXTS]
    assert set(together.queries) == set(alone[0].queries)
    close = tm.padding_close(model)
    for name, t in together.queries.items():
        torch.testing.assert_close(t, torch.cat([a.queries[name] for a in alone]), equal_nan=True, msg=name, **close)
    merged = GeometryResult.merge(alone)
    for name in together.fields:
        assert torch.equal(together.count(name), merged.count(name)), name
        torch.testing.assert_close(together.per_head(name), merged.per_head(name), equal_nan=True, msg=name, **close)


def test_prepend_bos_controls_the_sink(model):
    with_bos = run_with_geometry_hooks(model, TEXTS[0])
    without = run_with_geometry_hooks(model, TEXTS[0], prepend_bos=False)
    assert with_bos.n_documents == without.n_documents == 1
    assert with_bos.n_tokens == without.n_tokens + 1
    assert with_bos.config.prepend_bos and not without.config.prepend_bos


def test_gqa_alignment_reproduces_hook_z(model):
    tokens = tm.with_bos(tm.random_tokens(2, 9))
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.startswith("blocks.0.attn.hook_"))
    pattern, v, z = cache[pattern_hook(0)], cache[value_hook(0)], cache[z_hook(0)]
    n_heads, n_kv = pattern.shape[1], v.shape[2]
    assert n_kv == (getattr(model.cfg, "n_key_value_heads", None) or n_heads)
    aligned = v[:, :, kv_head_of(torch.arange(n_heads), n_heads, n_kv)]
    torch.testing.assert_close(torch.einsum("bhqk,bkhd->bqhd", pattern, aligned), z)


def test_one_forward_pass_and_no_run_with_cache(model, monkeypatch):
    calls = []
    handle = model.blocks[0].register_forward_pre_hook(lambda *_: calls.append(1))
    monkeypatch.setattr(model, "run_with_cache", lambda *a, **k: pytest.fail("run_with_cache used"), raising=False)
    try:
        run_with_geometry_hooks(model, TEXTS)
    finally:
        handle.remove()
    assert calls == [1]


def test_hook_names_do_not_format_the_runs_tensors(model, monkeypatch):
    """TransformerLens names each hook after repr(hook.func); the state's repr must not format tokens or grids."""
    from transformer_lens.hook_points import HookPoint

    names = []
    add_hook = HookPoint.add_hook

    def recording(self, hook, *args, **kwargs):
        names.append(repr(hook.func) if isinstance(hook, functools.partial) else repr(hook))
        return add_hook(self, hook, *args, **kwargs)

    monkeypatch.setattr(HookPoint, "add_hook", recording)
    run_with_geometry_hooks(model, ["a long enough text to have many token ids in its prepared tensor " * 4],
                            capture="pattern")  # the path that attaches hooks
    assert names and all("tensor(" not in name and len(name) < 200 for name in names), max(names, key=len)[:300]


def test_model_left_exactly_as_it_was(model):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hooks_before = tm.hook_counts(model)
    training = model.training
    run_with_geometry_hooks(model, TEXTS, query_positions="all")
    assert tm.hook_counts(model) == hooks_before
    assert model.training == training
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_hooks_removed_when_a_hook_raises(model, monkeypatch):
    hooks_before = tm.hook_counts(model)

    def boom(*args, **kwargs):
        raise RuntimeError("engine failed mid-pass")

    # The selection metrics run inside the pattern hook, through the always-on selection diagnostic.
    monkeypatch.setattr("tl_geometry.diagnostics.selection.chunk_metrics", boom)
    with pytest.raises(RuntimeError, match="engine failed mid-pass"):
        run_with_geometry_hooks(model, TEXTS)
    assert tm.hook_counts(model) == hooks_before


def test_hooks_removed_when_the_model_raises(model):
    def boom(*args):
        raise RuntimeError("model failed mid-pass")

    handle = model.blocks[1].register_forward_pre_hook(boom)
    hooks_before = tm.hook_counts(model)
    try:
        with pytest.raises(RuntimeError, match="model failed mid-pass"):
            run_with_geometry_hooks(model, TEXTS)
        assert tm.hook_counts(model) == hooks_before
    finally:
        handle.remove()


@pytest.mark.parametrize(
    "tokens, overrides, message",
    [
        (torch.zeros(2, 5), {}, "tokens: expected integer token ids, got dtype torch.float32"),
        (torch.zeros(5, dtype=torch.long), {}, r"tokens: expected shape \[batch, pos\].*tokens.unsqueeze\(0\)"),
        (torch.zeros(1, 2, 5, dtype=torch.long), {}, r"expected shape \[batch, pos\]"),
        ("the cat", {"layers": [0, 7]}, r"layers: \[7\] out of range; the model has 2 layers"),
        ("the cat", {"heads": [4]}, r"heads: \[4\] out of range; the model has 4 heads .*0..3"),
        ("the cat", {"n_grid": [0, 1]}, "n_grid: every N must be >= 1"),
        ("the cat", {"query_positions": [5]}, r"query_positions: \[5\] reach beyond the shortest sequence \(3 tokens\)"),
        ("the cat", {"query_positions": [-4]}, r"query_positions: \[-4\] reach beyond the shortest sequence"),
        ("the cat", {"colour": "red"}, r"unknown config field\(s\) \['colour'\]; valid names are"),
    ],
)
def test_bad_input_raises_with_a_helpful_message(model, tokens, overrides, message):
    with pytest.raises(GeometryError, match=message):
        run_with_geometry_hooks(model, tokens, **overrides)


def test_text_on_a_model_without_tokenizer(model, monkeypatch):
    monkeypatch.setattr(model, "tokenizer", None)
    with pytest.raises(GeometryError, match="tokens: got text but the model has no tokenizer"):
        run_with_geometry_hooks(model, "the cat")


class _FakeModel:
    """Just enough of a TransformerLens model to reach the checks before the forward pass."""

    def __init__(self, hook_names):
        self.cfg = type("Cfg", (), {"n_heads": 2, "n_layers": 1, "n_key_value_heads": None, "model_name": "fake"})()
        self.hook_dict = dict.fromkeys(hook_names)
        self.tokenizer = None

    def hooks(self, *args, **kwargs):
        raise AssertionError("must not get this far")

    def to_tokens(self, *args, **kwargs):
        raise AssertionError("must not get this far")

    def forward(self, tokens, return_type=None):
        raise AssertionError("must not get this far")

    __call__ = forward


def test_missing_hook_is_named():
    with pytest.raises(GeometryError, match=r"no hook point 'blocks.0.attn.hook_v'.*enable_compatibility_mode"):
        run_with_geometry_hooks(_FakeModel([]), torch.zeros(1, 3, dtype=torch.long))


def test_padding_refused_without_attention_mask_support():
    fake = _FakeModel([value_hook(0), pattern_hook(0)])
    tokens = torch.zeros(2, 3, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    with pytest.raises(GeometryError, match="padded but this model's forward takes no attention_mask"):
        run_with_geometry_hooks(fake, tokens, attention_mask=mask)


def test_attention_mask_with_gaps_is_refused(model):
    tokens = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(GeometryError, match="one contiguous run"):
        run_with_geometry_hooks(model, tokens, attention_mask=torch.tensor([[1, 0, 1, 1]]))
