"""What a claim of the paper is, declared once, and the registry that lists them.

A claim (`PaperClaim`) declares everything about itself in one object: its
key and words, where the paper makes it and what the paper reports, the
statistic function that reads it off a result, the thresholds of its
verdict, how its bootstrap interval is read (`IntervalChoice`), the run
option that measures it, the documents below which its verdict is refused,
and its row of the documentation's table. `tl_geometry.analysis.claims`
declares the paper's claims and registers them in its ``CLAIMS``; the
scorecard, `compare`, the report and the docs generator read that registry,
in its order (the paper's). Nothing about a claim is looked up in a table
keyed by its name.

>>> t = Thresholds(">=", 0.8, 0.5)
>>> t.reaches(0.9, t.holds), t.reaches(0.6, t.holds)
(True, False)
"""

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from tl_geometry.errors import GeometryError

Direction = Literal[">=", "<="]
FigureKind = Literal["per_head", "share", "curves", "envelopes", "roles_by_depth", "role_curves"]
"""What a claim's evidence is, so that a figure can draw it: per-head values (a histogram), a share (a bar), curves
against N, curves with their lower and upper envelopes, role counts by depth, or curves per role."""
IntervalMethod = Literal["percentile", "bias-corrected", "basic", "shifted", "normal"]
LEVEL = 0.95  # the nominal coverage of every claim's interval


@dataclass(frozen=True)
class Thresholds:
    """When a claim's statistic holds (``holds``) or partly holds (``partly``), compared with ``direction``."""

    direction: str
    holds: float
    partly: float

    def __post_init__(self) -> None:
        if self.direction not in get_args(Direction):
            raise GeometryError(f"Thresholds.direction: expected one of {get_args(Direction)}, got {self.direction!r}")
        if not (self.holds >= self.partly if self.direction == ">=" else self.holds <= self.partly):
            raise GeometryError(
                f"Thresholds: 'holds' ({self.holds}) must be at least as strict as 'partly' ({self.partly}) "
                f"for direction {self.direction!r}"
            )

    def reaches(self, value: float, threshold: float) -> bool:
        return value >= threshold if self.direction == ">=" else value <= threshold


@dataclass(frozen=True)
class IntervalChoice:
    """How a claim's bootstrap interval is read from its replicates.

    Attributes:
        method: one of `tl_geometry.analysis.intervals.METHODS`.
        expanded: the level expanded for the number of documents (Hesterberg), or the plain level.
        level: the level the quantiles are read at: ``LEVEL``, or higher where no method covered at
            ``LEVEL`` on the simulated population the choice was made on (calibrated there).
        uncertain: where the interval covered under 90 % at 16 or 32 documents on some population it was
            not chosen on, the lowest and highest of those held-out coverages (the interval says so); else None.
        per_head_z: for a statistic of heads judged against a threshold (a share of heads past it, the heads'
            roles), the set interval at this many standard errors per head joined with the bootstrap interval
            where that is wider (`tl_geometry.analysis.set_intervals`); None: the bootstrap interval alone.
    """

    method: str
    expanded: bool = True
    level: float = LEVEL
    uncertain: tuple[float, float] | None = None
    per_head_z: float | None = None

    def __post_init__(self) -> None:
        if self.method not in get_args(IntervalMethod):
            raise GeometryError(f"IntervalChoice.method: expected one of {get_args(IntervalMethod)}, got {self.method!r}")
        if not 0 < self.level < 1:
            raise GeometryError(f"IntervalChoice.level: expected a level in (0, 1), got {self.level!r}")
        if self.per_head_z is not None and not self.per_head_z > 0:
            raise GeometryError(f"IntervalChoice.per_head_z: expected a number of standard errors > 0 (or None: no "
                                f"set interval), got {self.per_head_z!r}")


@dataclass(frozen=True)
class PaperClaim:
    """One claim of the paper, declared once: what it says, how it is measured, and how it is judged.

    Attributes:
        key: a short identifier (the index of the claims table).
        claim: the claim in words.
        paper_ref: where the paper makes it (figure, section).
        paper_value: what the paper reports (a quote where it gives one).
        statistic: what the claim's value is, in a few words (a column of the claims table).
        thresholds: the verdict's thresholds.
        check: the statistic function, ``check(declared, result, roles)`` -> a
            `tl_geometry.analysis.claims.Claim` row; ``declared`` is this
            object (its thresholds, interval and settings are read from it),
            ``roles`` a function that returns the heads' `RoleWeights` (called
            only by the claims that read roles, at most once per result).
        interval: how its bootstrap interval is read.
        option: the run option that measures it (for "not measured").
        min_documents: below this many documents the verdict is "too few documents".
        docs_name, docs_paper, docs_statistic: its row of the documentation's table of claims: its name, where
            the paper makes it and what it reports, and its statistic with what is reported beside it.
        literal_interval: where the paper's reading beside ours has an interval read otherwise, how (else
            the claim's own ``interval``).
        literal_min_documents: the paper's reading's own count, where it differs from ``min_documents``.
        reads: the fields the verdict's statistic reads, where the claim has a choice (e.g. the excess over
            chance, not the raw curves).
        literal_reads: the fields the paper's reading beside it reads.
        reads_roles: the statistic weights heads by their roles.
        figure: what the claim's evidence is (`FigureKind`), for the figures that draw it.
        figure_axis: the axis title of a ``"per_head"`` figure (what one head's value is).
        formerly: the keys it had before; ``CLAIMS[former_key]`` still reads it, with a DeprecationWarning.
    """

    key: str
    claim: str
    paper_ref: str
    paper_value: str
    statistic: str
    thresholds: Thresholds
    check: Callable[..., Any]
    interval: IntervalChoice
    option: str
    min_documents: int
    docs_name: str
    docs_paper: str
    docs_statistic: str
    literal_interval: IntervalChoice | None = None
    literal_min_documents: int | None = None
    reads: tuple[Any, ...] = ()
    literal_reads: tuple[Any, ...] = ()
    reads_roles: bool = False
    figure: str = "curves"
    figure_axis: str = ""
    formerly: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.figure not in get_args(FigureKind):
            raise GeometryError(f"PaperClaim.figure ({self.key}): expected one of {get_args(FigureKind)}, "
                                f"got {self.figure!r}")
        if not self.key.isidentifier():
            raise GeometryError(f"PaperClaim.key: expected a Python identifier (e.g. 'stable_norms'), got {self.key!r}")
        if self.min_documents < 1:
            raise GeometryError(f"PaperClaim.min_documents ({self.key}): expected at least 1, got {self.min_documents}")

    @property
    def rule(self) -> str:
        """The thresholds in words."""
        t = self.thresholds
        return f"holds if {t.direction} {t.holds:g}, partly if {t.direction} {t.partly:g}"

    def replace(self, **changes: Any) -> "PaperClaim":
        """This declaration with some fields changed (e.g. other thresholds), checked as a new one."""
        return dataclasses.replace(self, **changes)


class ClaimRegistry(Mapping[str, PaperClaim]):
    """The claims a scorecard checks, by key, in the order they are shown.

    A read-only mapping with `register` and `unregister` for claims of your
    own, and item assignment to replace a declaration by one of the same key
    (other thresholds, say: ``CLAIMS["exponential_decay"] =
    CLAIMS["exponential_decay"].replace(thresholds=Thresholds("<=", 0.15, 0.25))``).
    """

    def __init__(self, built_in: Iterable[PaperClaim] = ()) -> None:
        self._claims: dict[str, PaperClaim] = {}
        self._built_in: frozenset[str] = frozenset()
        for declared in built_in:
            self.register(declared)
        self._built_in = frozenset(self._claims)

    def register(self, declared: PaperClaim) -> PaperClaim:
        """Add a claim after the others; GeometryError if its key is taken."""
        if not isinstance(declared, PaperClaim):
            raise GeometryError(f"claims: expected a PaperClaim, got {type(declared).__name__}")
        if declared.key in self._claims:
            raise GeometryError(f"claim {declared.key!r} is already registered; choose another key, or assign "
                                "CLAIMS[key] = ... to replace its declaration")
        self._claims[declared.key] = declared
        return declared

    def unregister(self, key: str) -> PaperClaim:
        """Remove a claim you registered; GeometryError if it is unknown or one of the paper's."""
        self[key]  # unknown: GeometryError
        if key in self._built_in:
            raise GeometryError(f"claim {key!r} is one of the paper's; only claims you registered can be removed")
        return self._claims.pop(key)

    def __setitem__(self, key: str, declared: PaperClaim) -> None:
        self[key]  # known keys only: a new claim is registered, not assigned
        if not isinstance(declared, PaperClaim) or declared.key != key:
            raise GeometryError(f"claims[{key!r}]: expected a PaperClaim with key {key!r}, got {declared!r:.80}")
        self._claims[key] = declared

    def current_key(self, key: str) -> str:
        """``key``, or the key now of the claim that had ``key`` before (`PaperClaim.formerly`)."""
        return next((c.key for c in self._claims.values() if key in c.formerly), key)

    def __getitem__(self, key: str) -> PaperClaim:
        if key not in self._claims and (now := self.current_key(key)) != key:
            warnings.warn(f"claim {key!r} is now called {now!r}; {key!r} is deprecated", DeprecationWarning,
                          stacklevel=2)
            key = now
        if key not in self._claims:
            raise GeometryError(f"claims: unknown claim {key!r}; the claims are {list(self._claims)}")
        return self._claims[key]

    def __contains__(self, key: object) -> bool:
        return key in self._claims

    def get(self, key: str, default: Any = None) -> Any:
        return self._claims.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._claims)

    def __len__(self) -> int:
        return len(self._claims)

    def __repr__(self) -> str:
        return f"ClaimRegistry({', '.join(self._claims)})"
