"""What `linnet verify` found: one `CheckResult` per pair of computations, in a `VerifyReport`, as data (the
mutation suite and the language server read it) and as text and JSON (the CLI prints them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class ModulePart:
    """The first module whose outputs part between the two ways: its checkpoint path ("" for the root), its method
    in each way (`forward`, `step`), the first position (or row) where they part, max |Δ| and the tolerance, the
    shapes compared, and `before`: the child it called with inputs that already part (the difference is in this
    module's own code before that call), or None."""

    path: str
    methods: tuple[str, str]
    position: int | None
    max_delta: float
    tolerance: float
    shapes: tuple[tuple[int, ...], tuple[int, ...]]
    before: str | None = None

    def describe(self) -> str:
        name = self.path or "the root module"
        ways = self.methods[0] if self.methods[0] == self.methods[1] else f"{self.methods[0]} vs {self.methods[1]}"
        where = f" at {self.position}" if self.position is not None else ""
        text = f"{name} ({ways}){where}: max |Δ| {self.max_delta:.3g} > {self.tolerance:.3g}"
        if self.before:
            text += f"; the inputs it gives {self.before} already part (the difference is in {name}'s own code)"
        return text


@dataclass
class CheckResult:
    """One pair of computations that must agree. `kind`: "cache", "batch", "padding" or "same result"; `ways`: the
    entries of each way (`("forward", "step")`); `axis`: what `position` counts ("position": tokens, "row": batch
    rows); `agree`; `position`: the first position (or row) where the entry's outputs part; `max_delta` and
    `tolerance` of the entry's outputs; `module`: the first module whose outputs part (None when they agree, or on a
    backend without module records); `read_by_one_way`: parameters read by one way's entries and not the other's,
    by the entry that reads them."""

    kind: str
    ways: tuple[str, str]
    description: str
    axis: str
    agree: bool
    position: int | None = None
    max_delta: float = 0.0
    tolerance: float = 0.0
    module: ModulePart | None = None
    read_by_one_way: dict[str, list[str]] = field(default_factory=dict)

    def describe(self) -> str:
        """One line (or a few) for the terminal."""
        head = f"{self.kind}: {self.description}"
        if self.agree:
            return f"ok   {head} (max |Δ| {self.max_delta:.2g} <= {self.tolerance:.2g})"
        lines = [f"PART {head}"]
        if self.max_delta > self.tolerance:
            where = f" first at {self.axis} {self.position}" if self.position is not None else ""
            delta = f"max |Δ| {self.max_delta:.3g} > {self.tolerance:.3g}"
            lines.append(f"  `{self.ways[0]}` and `{self.ways[1]}` part{where}: {delta}")
        if self.module is not None:
            lines.append(f"  first module whose outputs part: {self.module.describe()}")
        for reader, paths in self.read_by_one_way.items():
            shown = ", ".join(paths[:6]) + (f" and {len(paths) - 6} more" if len(paths) > 6 else "")
            lines.append(f"  read only by `{reader}`'s way: {shown}")
        return "\n".join(lines)


@dataclass
class VerifyReport:
    """Every check `linnet verify` ran on one source: the file, preset, weights (None: seeded random ones), working
    dtype, numerics, backend, the relative tolerance, the checks and the seconds they took (loading included)."""

    file: str
    preset: str | None
    weights: str | None
    dtype: str
    numerics: str
    backend: str
    rtol: float
    checks: list[CheckResult]
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        return all(c.agree for c in self.checks)

    @property
    def first_part(self) -> CheckResult | None:
        return next((c for c in self.checks if not c.agree), None)

    def to_json(self) -> dict:
        return asdict(self) | {"agree": self.agree}

    def format_text(self) -> str:
        weights = self.weights or "seeded random weights"
        preset = f", preset {self.preset}" if self.preset else ""
        head = f"{self.file}{preset}, {weights}, {self.dtype} {self.numerics} on {self.backend} (rtol {self.rtol:g})"
        lines = [head, *(c.describe() for c in self.checks)]
        parted = sum(not c.agree for c in self.checks)
        verdict = "all agree" if not parted else f"{parted} of {len(self.checks)} part"
        lines.append(f"{len(self.checks)} checks, {verdict} ({self.seconds:.1f} s)")
        return "\n".join(lines) + "\n"


__all__ = ["ModulePart", "CheckResult", "VerifyReport"]
