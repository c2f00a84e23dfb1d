"""`linnet diff`: Linnet against the reference implementation of a checkpoint, module by module. `modules` runs both
sides and compares every module both have (`diff_model`, `DiffReport`); `reference` loads the reference (transformers,
diffusers, sentence-transformers) and maps each entry to its call. A package of its own because it drives a backend
(`linnet.runtimes.backends`), which the modules at the top of `linnet.runtimes` never import."""

from linnet.runtimes.diff.modules import TOLERANCE, DiffReport, ModuleDiff, diff_model, diff_traces
from linnet.runtimes.diff.reference import LIBRARIES, ReferenceUnavailable

__all__ = ["LIBRARIES", "TOLERANCE", "DiffReport", "ModuleDiff", "ReferenceUnavailable", "diff_model", "diff_traces"]
