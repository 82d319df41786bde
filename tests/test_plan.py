"""The run plan, through the public calls: the N grid decided once per run, ``capture="auto"`` kept as asked
with the path taken recorded, the fallback said once per run, and no state of a run left in a module global."""

import json
import sys
import threading
import warnings

import pytest
import torch

from tests import tiny_models as tm
from tl_geometry import GeometryConfig, GeometryError, GeometryResult, analyze_corpus, run_with_geometry_hooks

pytestmark = pytest.mark.model

TEXTS = ["the cat sat on the mat and ran", "a dog", "one two three four five six seven eight nine ten house sun moon",
         "big red sun"]


@pytest.fixture(scope="module")
def bridge():
    return tm.make_model("compat-llama")


def _keys_of_longest(model) -> int:
    """Keys the last query of the longest text sees: all its tokens, BOS included (global causal attention)."""
    return max(len(model.to_tokens(text, prepend_bos=True)[0]) for text in TEXTS)


def test_the_grid_is_the_requested_one_for_the_longest_query(bridge):
    """"all" is every N up to the keys of the longest query; a list is itself (N above the keys is kept, for NaN)."""
    longest = _keys_of_longest(bridge)
    every = run_with_geometry_hooks(bridge, TEXTS, n_grid="all", n_bootstrap=0)
    assert every.n_grid.tolist() == list(range(1, longest + 1))
    chosen = run_with_geometry_hooks(bridge, TEXTS, n_grid=[3, longest + 5], n_bootstrap=0)
    assert chosen.n_grid.tolist() == [3, longest + 5]
    assert bool(chosen.precision[..., 1].isnan().all())  # larger than any query's keys: missing, never clipped


def test_a_corpus_in_batches_has_the_grid_of_its_longest_query(bridge):
    """One grid for the whole corpus whatever the batching: that of the longest query (the default grid: every N
    to 16, then log-spaced, strictly increasing, ending at the most keys a query sees)."""
    longest = _keys_of_longest(bridge)
    for n_grid in ("all", "default"):
        whole = run_with_geometry_hooks(bridge, TEXTS, n_grid=n_grid, n_bootstrap=0)
        batched = analyze_corpus(bridge, TEXTS, batch_size=1, progress=False, n_grid=n_grid, n_bootstrap=0)
        assert torch.equal(whole.n_grid, batched.n_grid), n_grid
        grid = batched.n_grid.tolist()
        assert grid[: min(16, longest)] == list(range(1, min(16, longest) + 1))
        assert grid[-1] == longest and grid == sorted(set(grid))


def test_the_config_keeps_the_request_and_the_result_records_the_path(bridge):
    """capture="auto" stays "auto" in the result's config; the path taken is in its provenance, on both calls."""
    single = run_with_geometry_hooks(bridge, TEXTS[0], n_grid=[1, 2], n_bootstrap=0)
    corpus = analyze_corpus(bridge, TEXTS, batch_size=2, progress=False, n_grid=[1, 2], n_bootstrap=0)
    for result in (single, corpus):
        assert result.config.capture == "auto" and result.provenance["capture"] == "rows"
    asked = run_with_geometry_hooks(bridge, TEXTS[0], n_grid=[1, 2], n_bootstrap=0, capture="pattern")
    assert (asked.config.capture, asked.provenance["capture"]) == ("pattern", "pattern")
    assert "capture_reason" not in asked.provenance


def test_the_fallback_is_said_once_per_run_however_many_batches(bridge):
    """A hook attached to the model sends auto to the pattern: one warning per run (under a filter that shows
    every warning), not one per batch; the result names the reason."""
    def keep(pattern, hook):
        return pattern

    with bridge.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", keep)]), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = analyze_corpus(bridge, TEXTS, batch_size=1, progress=False, n_grid=[1, 2], n_bootstrap=0)
        again = analyze_corpus(bridge, TEXTS, batch_size=1, progress=False, n_grid=[1, 2], n_bootstrap=0)
    said = [w for w in said if 'capture="auto"' in str(w.message)]
    assert len(said) == 2 and all(w.filename == __file__ for w in said)  # one per run, at the caller's line
    for run in (result, again):
        assert (run.config.capture, run.provenance["capture"]) == ("auto", "pattern")
        assert run.provenance["capture_reason"] in str(said[0].message)
    assert result.equals(again)


def _saved_as_before_the_plan(result, path):
    """``result`` saved and loaded back as a file of the version before the plan kept the request: the config held
    the path taken and the provenance did not record it (the JSON edited so; the arrays are untouched)."""
    json_path = result.save(path)[1]
    meta = json.loads(json_path.read_text())
    meta["config"]["capture"] = meta["provenance"].pop("capture")
    meta["provenance"].pop("capture_reason", None)
    json_path.write_text(json.dumps(meta))
    return GeometryResult.load(path)


def test_an_auto_result_merges_with_a_file_that_recorded_the_path_taken_in_its_config(bridge, tmp_path):
    """A run of capture="auto" (it takes the rows here) and an older file of the same path merge, in either
    order, into the documents of both; the merged config names the path both took (they asked differently). A
    file of the other path is refused, naming the paths; two "auto" runs that took different paths asked alike
    and merge, keeping the request, but not with a third part that asked otherwise."""
    new = run_with_geometry_hooks(bridge, TEXTS[:2], n_grid=[1, 2], n_bootstrap=0)
    same = _saved_as_before_the_plan(run_with_geometry_hooks(bridge, TEXTS[2:], n_grid=[1, 2], n_bootstrap=0),
                                     tmp_path / "rows")
    assert (new.config.capture, new.provenance["capture"]) == ("auto", "rows")
    assert same.config.capture == "rows" and "capture" not in same.provenance
    one_pass = run_with_geometry_hooks(bridge, TEXTS, n_grid=[1, 2], n_bootstrap=0)
    for merged in (GeometryResult.merge(new, same), GeometryResult.merge(same, new)):
        assert merged.n_documents == one_pass.n_documents == 4 and merged.n_tokens == one_pass.n_tokens
        assert torch.equal(merged.count("precision"), one_pass.count("precision"))
        torch.testing.assert_close(merged.per_head("recall"), one_pass.per_head("recall"), rtol=1e-5, atol=1e-6)
        assert merged.config.capture == merged.provenance["capture"] == "rows"
    other = _saved_as_before_the_plan(run_with_geometry_hooks(bridge, TEXTS[2:], n_grid=[1, 2], n_bootstrap=0,
                                                              capture="pattern"), tmp_path / "pattern")
    for pair in ((new, other), (other, new)):
        with pytest.raises(GeometryError, match=r"merge: the results differ in capture path taken "
                                                r"\('pattern', 'rows'\) and asked \('auto', 'pattern'\)"):
            GeometryResult.merge(*pair)
    with bridge.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", lambda pattern, hook: pattern)]), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fell_back = run_with_geometry_hooks(bridge, TEXTS[2:], n_grid=[1, 2], n_bootstrap=0)  # auto: the pattern
    both = GeometryResult.merge(new, fell_back)  # asked alike
    assert both.config.capture == "auto" and both.provenance["capture"] == "pattern, rows"
    with pytest.raises(GeometryError, match=r"capture path taken \('pattern', 'rows'\) and asked \('auto', 'rows'\)"):
        GeometryResult.merge(new, fell_back, same)  # each pair with the first would merge; the three do not


def _module_state() -> dict[tuple[str, str], object]:
    """Every mutable container a module of the package holds at module level, or holds in a module-level
    object of its own (a registry, say), as a comparable snapshot: keys and the identity of each value."""
    state: dict[tuple[str, str], object] = {}

    def snapshot(value: object) -> object | None:
        if isinstance(value, dict):
            return sorted((repr(k), id(v)) for k, v in value.items())
        if isinstance(value, (list, bytearray)):
            return [id(v) for v in value]
        if isinstance(value, set):
            return sorted(repr(v) for v in value)
        return None

    for name, module in list(sys.modules.items()):
        if name.split(".")[0] != "tl_geometry" or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if attr.startswith("__"):
                continue
            if (shot := snapshot(value)) is not None:
                state[(name, attr)] = shot
            elif type(value).__module__.startswith("tl_geometry") and hasattr(value, "__dict__") \
                    and not isinstance(value, type):
                for inner, held in vars(value).items():
                    if (shot := snapshot(held)) is not None:
                        state[(name, f"{attr}.{inner}")] = shot
    return state


def test_a_run_leaves_no_state_in_module_globals(bridge):
    """After a first run of each kind (lazy imports and registries filled), further runs change no module-level
    container of the package: the rows path, the pattern path, auto's fallback with its warning, a corpus."""
    config = GeometryConfig(n_grid=[1, 2, 3], diagnostics="all", n_bootstrap=2)

    def runs() -> None:
        run_with_geometry_hooks(bridge, TEXTS, config=config)
        run_with_geometry_hooks(bridge, TEXTS, config=config, capture="pattern")
        analyze_corpus(bridge, TEXTS, config, batch_size=2, progress=False)

    runs()
    before = _module_state()
    runs()
    with bridge.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", lambda pattern, hook: pattern)]), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_with_geometry_hooks(bridge, TEXTS, config=config)  # auto falls back, and says so
    after = _module_state()
    changed = sorted(key for key in set(before) | set(after) if before.get(key) != after.get(key))
    assert not changed, f"module-level state changed by a run: {changed}"


def test_passes_of_two_models_at_once_keep_to_their_own_rows():
    """Two models' rows passes in two threads: each result equals that model's run alone (a pass's state is
    on its own model's modules, not shared)."""
    models = [tm.make_model("compat-llama", seed=seed) for seed in (0, 1)]
    config = GeometryConfig(n_grid=[1, 2, 4], n_bootstrap=2)
    alone = [run_with_geometry_hooks(model, TEXTS, config=config) for model in models]
    assert not alone[0].equals(alone[1])  # the two models differ, so a crossed pass would show
    together: list[list] = [[], []]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(2):
                together[i].append(run_with_geometry_hooks(models[i], TEXTS, config=config))
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for i in (0, 1):
        assert all(result.equals(alone[i]) for result in together[i])
