"""Results in file format 1 (written before results kept statistics): per-sequence arrays turned into statistics.

Format 1 kept every sequence's values, ``per_sequence/<name>`` shaped
``[sequence, layer, head_index, ...]``, plus ``n_grid`` and
``sequence_lengths``, in the ``.npz``; the ``.json`` held ``format_version``
1, the config, model name, layers, heads, versions and the ``.npz``'s SHA-256.
Each sequence becomes one document. Format 1 keeps no tokens, so the
bootstrap weights of the replicates come from each sequence's index in the
file (`sequence_index_weights`, with the n_bootstrap and seed of the file's
config, i.e. the defaults, since format 1 had neither): fine for one file,
but two converted files share those weights, so prefer re-running over
merging converted files.

Each field takes the declaration given by the caller, else the one the
installed diagnostics register under its name (if its axes fit the array),
else a default one: the axis of length ``len(n_grid)`` of a field format 1
had on the N grid is ``"n"``; the lag profile's axis is ``"lag"``; any other
trailing axis is ``"position"``; all keep moments, and `V1_BOOTSTRAP_FIELDS`
keep replicates.
"""

from collections.abc import Mapping

from jaxtyping import Int
from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.errors import GeometryError
from tl_geometry.results.accumulators import Accumulator
from tl_geometry.results.bootstrap import sequence_index_weights

V1_BOOTSTRAP = 200  # if the config has no n_bootstrap
V1_SEED = 0
V1_BOOTSTRAP_FIELDS = ("precision", "recall", "rho0")  # the headline metric and the pair of Figure 6
# Fields format 1 had on the N grid (selection metrics, bounds, margins, taxonomy curves), and by lag.
_V1_N_FIELDS = (
    "precision", "recall", "f_rmax", "f_rmin", "f_score", "r_min", "r_max", "s_norm", "k_out", "k_in",
    "taxonomy_s_norm", "s_norm_without_sink", "s_norm_without_last", "cos_s_sink", "cos_s_last",
)
_V1_N_PREFIXES = ("bound_", "margin_")
_V1_LAG_FIELDS = ("cosine_by_lag",)


def default_spec(name: str, tensor: Tensor, n_grid: Int[Tensor, " n"]) -> FieldSpec:
    """A declaration for a format-1 field ``[sequence, layer, head_index, ...]`` that has none."""
    trailing = tuple(tensor.shape[3:])
    on_grid = name in _V1_N_FIELDS or name.startswith(_V1_N_PREFIXES)
    axes = []
    for i, size in enumerate(trailing):
        if on_grid and i == len(trailing) - 1 and size == len(n_grid):
            axes.append("n")
        else:
            axes.append("lag" if name in _V1_LAG_FIELDS else "position")
    return FieldSpec(
        name=name,
        doc=f"{name} (converted from a format-1 result)",
        axes=tuple(axes),
        queries="last" if axes and axes[-1] != "n" else "mean",
        documents="moments",
        bootstrap=name in V1_BOOTSTRAP_FIELDS,
    )


def _registered(name: str, tensor: Tensor, n_grid: Int[Tensor, " n"]) -> FieldSpec | None:
    """The installed declaration of ``name`` if its axes fit the format-1 array, else None."""
    from tl_geometry.diagnostics.registry import REGISTRY  # imported late: the diagnostics import results

    try:
        spec = REGISTRY.field(name)
    except GeometryError:
        return None
    trailing = tuple(tensor.shape[3:])
    fits = len(spec.axes) == len(trailing) and all(
        axis != "n" or size == len(n_grid) for axis, size in zip(spec.axes, trailing)
    )
    return spec if fits else None


def accumulate_sequences(
    per_sequence: Mapping[str, Tensor],
    *,
    n_grid: Int[Tensor, " n"],
    layers: tuple[int, ...],
    heads: tuple[int, ...],
    sequence_lengths: Int[Tensor, " sequence"],
    specs: Mapping[str, FieldSpec] | None = None,
    n_bootstrap: int = V1_BOOTSTRAP,
    seed: int = V1_SEED,
) -> Accumulator:
    """An accumulator over per-sequence arrays, each sequence one document.

    Args:
        per_sequence: field name -> ``[sequence, layer, head_index, ...]``.
        specs: declarations to use by name (others: the registered one, else `default_spec`).
        n_bootstrap: replicates for the fields whose declaration asks for them.
        seed: the bootstrap seed.
    """
    if not per_sequence:
        raise GeometryError("per_sequence: expected at least one field, got none")
    given = dict(specs or {})
    declared = [
        given.get(name) or _registered(name, t, n_grid) or default_spec(name, t, n_grid)
        for name, t in per_sequence.items()
    ]
    acc = Accumulator(
        declared,
        layers=layers,
        heads=heads,
        n_grid=n_grid,
        n_bootstrap=n_bootstrap,
        replicate_fields=[spec.name for spec in declared if spec.bootstrap],
    )
    n_sequences = len(sequence_lengths)
    values = {name: t if t.is_floating_point() else t.double() for name, t in per_sequence.items()}
    acc.add(values, sequence_index_weights(n_sequences, n_bootstrap, seed), int(sequence_lengths.sum()))
    return acc
