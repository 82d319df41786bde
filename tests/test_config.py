"""GeometryConfig validation, overrides and the default grid."""

import pytest

from tl_geometry.config import GeometryConfig, make_config
from tl_geometry.engine.grid import default_n_grid
from tl_geometry.errors import GeometryError


def test_defaults():
    c = GeometryConfig()
    assert (c.n_grid, c.query_positions, c.layers, c.heads) == ("default", "last", None, None)
    assert (c.ranking, c.distance, c.prepend_bos, c.memory_budget_mib) == ("attention", "euclidean", True, 128.0)
    assert (c.diagnostics, c.settings, c.n_bootstrap, c.bootstrap_fields, c.seed, c.keep_queries) == (
        (), (), 200, None, 0, False)


def test_negative_query_positions_count_from_the_end():
    # Checked against the sequences when the config meets them (tl_geometry.capture.tokens.prepare_tokens).
    assert GeometryConfig(query_positions=[-1, 0, -3]).query_positions == (-1, 0, -3)


def test_settings_become_each_diagnostics_settings_and_round_trip_through_json():
    c = GeometryConfig(diagnostics=["bounds"], settings={"bounds": {"kappa": 500.0}}, bootstrap_fields=["recall", "k_in"])
    assert c.settings_for("bounds").kappa == 500.0
    assert c.settings_for("assumptions") == type(c.settings_for("assumptions"))()  # unnamed: the defaults
    assert c.bootstrap_fields == ("k_in", "recall")
    assert GeometryConfig.from_json(c.to_json()) == c


def test_sequences_become_tuples_and_round_trip_through_json():
    c = GeometryConfig(n_grid=[1, 2, 4], query_positions=range(3), layers=[0, 2], heads=(1,), memory_budget_mib=8)
    assert (c.n_grid, c.query_positions, c.layers, c.heads, c.memory_budget_mib) == ((1, 2, 4), (0, 1, 2), (0, 2), (1,), 8.0)
    assert GeometryConfig.from_json(c.to_json()) == c


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ranking": "nearest"}, r"ranking: expected one of \('attention', 'contribution'\), got 'nearest'"),
        ({"distance": "manhattan"}, r"distance: expected one of \('euclidean', 'cosine'\), got 'manhattan'"),
        ({"n_grid": "some"}, r"n_grid: expected one of \('default', 'all'\) or a sequence of positive integers, got 'some'"),
        ({"n_grid": [0, 1]}, "n_grid: every N must be >= 1"),
        ({"n_grid": []}, "n_grid: .*got an empty sequence"),
        ({"n_grid": [1.5]}, "n_grid: .*got the entry 1.5 of type float"),
        ({"query_positions": "first"}, r"query_positions: expected one of \('last', 'all'\)"),
        ({"query_positions": [1.5]}, "query_positions: .*got the entry 1.5 of type float"),
        ({"n_bootstrap": -1}, "n_bootstrap: expected an integer >= 0, got -1"),
        ({"seed": -1}, "seed: expected an integer >= 0, got -1"),
        ({"bootstrap_fields": "recall"}, "bootstrap_fields: expected a sequence of field names or None, got 'recall'"),
        ({"settings": {"bounds": {"kapa": 1.0}}}, r"settings\['bounds'\]: unknown field\(s\) \['kapa'\]"),
        ({"settings": {"nope": {}}}, r"diagnostics: unknown name 'nope'"),
        ({"layers": [0, 0]}, "layers: indices must be distinct"),
        ({"heads": [1.5]}, r"heads: expected a sequence of integers or None \(all\), got the entry 1.5"),
        ({"memory_budget_mib": 0}, "memory_budget_mib: expected a finite memory budget in MiB > 0, e.g. 128, got 0"),
        ({"memory_budget_mib": float("inf")}, "memory_budget_mib: expected a finite memory budget in MiB > 0, e.g. 128, got inf"),
    ],
)
def test_bad_fields_are_named_with_allowed_values(kwargs, message):
    with pytest.raises(GeometryError, match=message):
        GeometryConfig(**kwargs)


def test_overrides_replace_fields_and_unknown_names_are_listed():
    c = make_config(GeometryConfig(layers=[1]), {"heads": [0]})
    assert (c.layers, c.heads) == ((1,), (0,))
    with pytest.raises(GeometryError, match=r"unknown config field\(s\) \['nn_grid'\]; valid names are \['n_grid', "):
        make_config(None, {"nn_grid": [1]})
    with pytest.raises(GeometryError, match="ranking: expected one of"):
        make_config(None, {"ranking": "bad"})


@pytest.mark.parametrize("n_keys", [1, 5, 16, 17, 100, 1024, 4096])
def test_default_grid(n_keys):
    grid = default_n_grid(n_keys).tolist()
    assert grid[: min(n_keys, 16)] == list(range(1, min(n_keys, 16) + 1))
    assert grid[-1] == n_keys and grid == sorted(set(grid))
    assert len(grid) <= 40 and (n_keys < 100 or len(grid) >= 35)


def test_resolve_n_grid_modes():
    """The old method still answers (the run's plan decides the grid now), with a DeprecationWarning."""
    with pytest.warns(DeprecationWarning, match="grid_of"):
        assert GeometryConfig(n_grid="all").resolve_n_grid(5).tolist() == [1, 2, 3, 4, 5]
    with pytest.warns(DeprecationWarning, match="grid_of"):
        assert GeometryConfig(n_grid=[3, 9]).resolve_n_grid(5).tolist() == [3, 9]  # N > keys: NaN later, not clipped


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ((), ()),
        ("roles", ("roles",)),
        (["roles", "assumptions"], ("assumptions", "roles")),
        ("all", ("assumptions", "bounds", "roles", "chance")),
    ],
)
def test_diagnostics_are_normalised_to_canonical_order(given, expected):
    assert GeometryConfig(diagnostics=given).diagnostics == expected


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("nope", "diagnostics: unknown name(s) ['nope']; choose from ('assumptions', 'bounds', 'roles', 'chance'), 'all' or 'none'"),
        ([3], "diagnostics: unknown name(s) [3]"),
    ],
)
def test_bad_diagnostics_are_named(given, message):
    with pytest.raises(GeometryError) as info:
        GeometryConfig(diagnostics=given)
    assert message in str(info.value)
