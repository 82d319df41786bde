"""Synthetic attention rows and value states under the paper's Assumptions 1-3, and the 2-D toy of Figure 1.

The simulator draws, for each sample, value vectors v_0..v_{L-1} with

- ||v_i|| = C for i > 0 and ||v_0|| = lambda C (Assumption 1, exactly);
- cos(v_0, v_j) = rho0 for every j > 0 (Assumption 2.2, exactly);
- cos(v_i, v_j) = rho0^2 + (1 - rho0^2) cos(z_i, z_j) for i, j > 0, where z is
  an AR(1) process per dimension with coefficient e^{-beta}, so that
  E cos(z_i, z_j) ~ e^{-beta |i - j|} (Assumption 2.1 up to a floor).

The floor rho0^2 is forced: the two parts of Assumption 2 cannot both hold
for many tokens (a unit vector with cosine rho0 to K nearly orthogonal unit
vectors needs K rho0^2 <= 1). The sink's direction e is therefore shared by
every token with weight |rho0|, the least that gives cos(v_0, v_j) = rho0:
v_j = C (|rho0| e + sqrt(1 - rho0^2) z_j / ||z_j||), v_0 = sign(rho0) lambda C e,
with z_j orthogonal to e.

Attention rows follow the four-phase profile of Assumption 3 and are the same
for every sample (the expectation in Theorems 1-2 is over the value states).
"""

import math
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tl_geometry.engine.metrics import selection_metrics
from tl_geometry.errors import GeometryError


@dataclass(frozen=True)
class AttentionProfile:
    """Parameters of the four-phase attention profile (Assumption 3).

    Before normalisation, alpha_0 = p_sink; alpha_i = p_base for 1 <= i <= t1;
    p_base (1 + eta cos(omega i)) for t1 < i <= t2; p_base e^{eta (i - t2)}
    for i > t2.

    Attributes:
        p_sink: the sink's weight (> 0).
        p_base: the plateau weight (> 0).
        eta: oscillation amplitude and recency growth rate, in [0, 1] so that
            the oscillation stays >= 0.
        omega: oscillation frequency (radians per position).
        t1: end of the plateau (>= 0).
        t2: start of the exponential phase (>= t1; t1 == t2: no oscillation).
    """

    p_sink: float = 0.5
    p_base: float = 1e-3
    eta: float = 0.05
    omega: float = 0.5
    t1: int = 16
    t2: int = 48

    def __post_init__(self) -> None:
        checks = (
            ("p_sink", self.p_sink > 0, "> 0"),
            ("p_base", self.p_base > 0, "> 0"),
            ("eta", 0 <= self.eta <= 1, "in [0, 1]"),
            ("omega", math.isfinite(self.omega), "finite"),
            ("t1", self.t1 >= 0, ">= 0"),
            ("t2", self.t2 >= self.t1, f">= t1 = {self.t1}"),
        )
        for name, ok, want in checks:
            if not ok:
                raise GeometryError(f"AttentionProfile.{name}: expected {want}, got {getattr(self, name)!r}")


def attention_profile(profile: AttentionProfile, n_keys: int) -> Float[Tensor, " key"]:
    """The four-phase attention row over keys 0..n_keys-1, normalised to sum 1 (float64).

    The whole row (sink included) is divided by its sum, which keeps every
    ratio of the profile (p_sink / p_base, the oscillation, the growth) and
    makes it a probability vector; the fitted p_sink and p_base are therefore
    weights relative to each other.

    Args:
        profile: the parameters.
        n_keys: number of keys (>= 1), the sink at 0.

    Returns:
        alpha, ``[key]``, positive, summing to 1.

    Example:
        >>> a = attention_profile(AttentionProfile(p_sink=1.0, p_base=1.0, eta=0.0, t1=1, t2=1), 4)
        >>> a.tolist()
        [0.25, 0.25, 0.25, 0.25]
    """
    if n_keys < 1:
        raise GeometryError(f"n_keys: expected at least 1 key, got {n_keys}")
    i = torch.arange(n_keys, dtype=torch.float64)
    p = profile
    raw = torch.where(
        i <= p.t1,
        torch.full_like(i, p.p_base),
        torch.where(i <= p.t2, p.p_base * (1 + p.eta * torch.cos(p.omega * i)), p.p_base * torch.exp(p.eta * (i - p.t2))),
    )
    raw[0] = p.p_sink
    return raw / raw.sum()


@dataclass(frozen=True)
class SimulationSettings:
    """One setting of the simulator.

    Attributes:
        d_head: dimension d of the value vectors (>= 2).
        n_keys: L, keys 0..L-1 with the sink at 0 (>= 2).
        c: the non-sink value norm C (> 0).
        lam: the sink's norm ratio lambda (> 0).
        beta: cosine decay rate (> 0).
        rho0: the sink cosine, in (-1, 1).
        profile: the attention profile.
    """

    d_head: int = 64
    n_keys: int = 128
    c: float = 1.0
    lam: float = 0.1
    beta: float = 0.5
    rho0: float = 0.2
    profile: AttentionProfile = AttentionProfile()

    def __post_init__(self) -> None:
        checks = (
            ("d_head", self.d_head >= 2, ">= 2"),
            ("n_keys", self.n_keys >= 2, ">= 2"),
            ("c", self.c > 0, "> 0"),
            ("lam", self.lam > 0, "> 0"),
            ("beta", self.beta > 0, "> 0"),
            ("rho0", -1 < self.rho0 < 1, "in (-1, 1)"),
        )
        for name, ok, want in checks:
            if not ok:
                raise GeometryError(f"SimulationSettings.{name}: expected {want}, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class SyntheticRows:
    """Simulated attention rows and value states.

    Attributes:
        settings: what they were drawn from.
        alpha: attention rows, ``[sample, key]`` (the same profile in every row).
        values: value vectors, ``[sample, key, d_head]``.
    """

    settings: SimulationSettings
    alpha: Float[Tensor, "sample key"]
    values: Float[Tensor, "sample key d_head"]


# The settings on which the theory is checked (tests/test_bounds.py) and kappa is
# chosen (benchmarks/bench_theory.py): recency-dominated and strongly oscillating
# profiles over a range of d, L, beta, lambda and rho_0.
RECENT_PROFILE = AttentionProfile(p_sink=0.3, p_base=1e-3, eta=0.3, omega=0.7, t1=8, t2=24)
WAVY_PROFILE = AttentionProfile(p_sink=0.5, p_base=1e-3, eta=0.9, omega=0.9, t1=4, t2=120)
VALIDATION_SETTINGS: tuple[SimulationSettings, ...] = (
    SimulationSettings(d_head=64, n_keys=64, lam=0.1, beta=3.0, rho0=0.2, profile=RECENT_PROFILE),
    SimulationSettings(d_head=16, n_keys=64, lam=0.1, beta=3.0, rho0=0.2, profile=RECENT_PROFILE),
    SimulationSettings(d_head=64, n_keys=128, lam=0.3, beta=2.0, rho0=-0.3, profile=RECENT_PROFILE),
    SimulationSettings(d_head=128, n_keys=256, lam=0.05, beta=4.0, rho0=0.1, profile=RECENT_PROFILE),
    SimulationSettings(d_head=64, n_keys=128, lam=0.1, beta=0.5, rho0=0.2, profile=WAVY_PROFILE),
    SimulationSettings(d_head=32, n_keys=128, lam=0.2, beta=1.0, rho0=0.5, profile=WAVY_PROFILE),
)
VALIDATION_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def simulate(settings: SimulationSettings, n_samples: int, *, seed: int = 0) -> SyntheticRows:
    """Draw ``n_samples`` independent rows under Assumptions 1-3 (float64, seeded).

    The AR(1) process z_i = e^{-beta} z_{i-1} + sqrt(1 - e^{-2 beta}) eps_i
    (stationary start) is written as one matrix product with its Cholesky
    factor A[i, k] = e^{-beta (i - k)} sqrt(1 - e^{-2 beta}) (k >= 1),
    A[i, 0] = e^{-beta i}, so all samples and positions are drawn at once.

    Args:
        settings: the parameters.
        n_samples: number of independent rows (>= 1).
        seed: seed of the torch.Generator.

    Returns:
        SyntheticRows with ``alpha`` ``[sample, key]`` and ``values`` ``[sample, key, d_head]``.

    Raises:
        GeometryError: n_samples < 1.

    Example:
        >>> rows = simulate(SimulationSettings(d_head=8, n_keys=16), 2)
        >>> rows.values.shape, round(float(rows.values[0, 1].norm()), 6)
        (torch.Size([2, 16, 8]), 1.0)
    """
    if n_samples < 1:
        raise GeometryError(f"n_samples: expected at least 1 sample, got {n_samples}")
    s = settings
    gen = torch.Generator().manual_seed(seed)
    n_tokens = s.n_keys - 1  # non-sink tokens 1..L-1
    phi = math.exp(-s.beta)
    pos = torch.arange(n_tokens, dtype=torch.float64)
    lag = pos[:, None] - pos[None, :]
    factor = torch.where(lag >= 0, phi ** lag.clamp(min=0), 0.0) * math.sqrt(1 - phi**2)
    factor[:, 0] = phi**pos  # stationary start: z_1 ~ N(0, 1)
    eps = torch.randn(n_samples, n_tokens, s.d_head - 1, generator=gen, dtype=torch.float64)
    z = torch.einsum("ik,bkd->bid", factor, eps)
    z = z / torch.linalg.vector_norm(z, dim=-1, keepdim=True)
    shared = abs(s.rho0)
    tokens = torch.cat(
        [torch.full((n_samples, n_tokens, 1), shared, dtype=torch.float64), math.sqrt(1 - s.rho0**2) * z], dim=-1
    )
    sink = torch.zeros(n_samples, 1, s.d_head, dtype=torch.float64)
    sink[..., 0] = math.copysign(1.0, s.rho0) * s.lam
    values = s.c * torch.cat([sink, tokens], dim=1)
    alpha = attention_profile(s.profile, s.n_keys).expand(n_samples, -1).clone()
    return SyntheticRows(settings=s, alpha=alpha, values=values)


@dataclass(frozen=True)
class Toy2D:
    """The 2-D picture of Figure 1.

    Attributes:
        points: token embeddings on the unit circle, ``[point, 2]``.
        weights: attention weights (sum 1), ``[point]``.
        scaled: alpha_i v_i, ``[point, 2]``.
        selected: top-N by weight (ties by index), ``[point]``.
        s: the representative vector, ``[2]``.
        distances: ||s - alpha_i v_i||, ``[point]``.
        r_min: nearest non-selected distance.
        r_max: farthest selected distance.
        precision: P(r_max, N).
        recall: R(r_min, N).
    """

    points: Float[Tensor, "point 2"]
    weights: Float[Tensor, " point"]
    scaled: Float[Tensor, "point 2"]
    selected: Bool[Tensor, " point"]
    s: Float[Tensor, " 2"]
    distances: Float[Tensor, " point"]
    r_min: float
    r_max: float
    precision: float
    recall: float


def toy_2d(n_points: int = 8, n_selected: int = 3, seed: int = 0) -> Toy2D:
    """Points on a circle scaled by softmax weights, the top-N selection and its two balls (Figure 1).

    Args:
        n_points: number of tokens (>= 2).
        n_selected: N, in [1, n_points - 1] (so that both balls exist).
        seed: seed of the torch.Generator.

    Returns:
        Toy2D, ready for a plot.

    Raises:
        GeometryError: n_points < 2 or n_selected outside [1, n_points - 1].

    Example:
        >>> toy = toy_2d()
        >>> toy.scaled.shape, int(toy.selected.sum())
        (torch.Size([8, 2]), 3)
    """
    if n_points < 2:
        raise GeometryError(f"n_points: expected at least 2 points, got {n_points}")
    if not 1 <= n_selected < n_points:
        raise GeometryError(f"n_selected: expected 1 <= N <= n_points - 1 = {n_points - 1}, got {n_selected}")
    gen = torch.Generator().manual_seed(seed)
    angles = torch.rand(n_points, generator=gen, dtype=torch.float64) * 2 * math.pi
    points = torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1)
    weights = torch.softmax(2 * torch.randn(n_points, generator=gen, dtype=torch.float64), dim=0)
    scaled = weights.unsqueeze(-1) * points
    order = torch.sort(weights, descending=True, stable=True).indices
    selected = torch.zeros(n_points, dtype=torch.bool)
    selected[order[:n_selected]] = True
    s = scaled[selected].sum(0)
    metrics = selection_metrics(weights, points, [n_selected])  # the engine's counts; distances for the picture
    return Toy2D(
        points=points,
        weights=weights,
        scaled=scaled,
        selected=selected,
        s=s,
        distances=torch.linalg.vector_norm(s - scaled, dim=-1),
        r_min=float(metrics.r_min[0]),
        r_max=float(metrics.r_max[0]),
        precision=float(metrics.precision[0]),
        recall=float(metrics.recall[0]),
    )
