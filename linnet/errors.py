"""One error hierarchy for the whole project (`linnet.errors`).

Everything Linnet raises for bad input (a source, a config, a checkpoint, a backend option, an
entry's inputs) is a `LinnetError`, so a caller (the CLI, the language server, a user's script)
catches one class and prints one line or block, never a traceback:

    LinnetError
    ├── SourceError        the source does not check, or cannot be lowered (`linnet.ir.ProgramError`)
    │   ├── ConfigError    a config value (preset, checkpoint config, --config) the config type refuses
    │   └── UnknownPreset  a preset name the source does not declare (`--preset`: a usage error, exit 2)
    ├── LoadError          a model cannot be loaded: names or shapes that don't match (L501, L502),
    │   │                  no weights to load, random weights that would not fit in memory
    │   └── CheckpointError  a checkpoint that cannot be opened or read (path, format, corrupt data)
    ├── BackendError       what this backend cannot run here: mode, device, dtype, numerics, provider,
    │                      ops without kernels; or a bad backend argument
    ├── RunError           an entry called with inputs that don't fit its signature or the KV cache
    │                      (also a ValueError)
    ├── CodegenError       an op or argument a code generator or exporter cannot express
    ├── ExportError        a model a checkpoint format (Hugging Face, GGUF) cannot express: a family,
    │                      a config value or a tokenizer the format has no spelling for; or an output
    │                      path that cannot be written
    ├── TrainError         a training run that cannot start or go on: a data row missing a field
    │                      (file:line), a LoRA target pattern that matches nothing, a backend that
    │                      does not train, a reward function that raises
    ├── TrainInterrupted   a training run stopped by SIGTERM, SIGHUP or SIGINT (after saving a
    │                      checkpoint when it had trained a step); not bad input
    └── AudioError         an audio file that cannot be read: missing, not a WAV file, or a sample
                           format or rate the reader does not take (`linnet transcribe --audio`)

An error that has a diagnostic code (docs/diagnostics.md; today the L5xx checkpoint codes) carries
it in `code`, not pasted into its message; `str(err)` renders both in one place
(`error[L501]: message`), the form `linnet check` prints. The front end's own diagnostics are
`linnet.semantics.diagnostics.Diagnostic` values, not exceptions: a `SourceError` carries them
rendered in its message, and the values themselves in `diagnostics` (for the language server,
which shows each on its own span).

This module imports nothing, so every layer may use it.
"""

from __future__ import annotations

__all__ = [
    "LinnetError",
    "SourceError",
    "ConfigError",
    "UnknownPreset",
    "LoadError",
    "CheckpointError",
    "BackendError",
    "RunError",
    "CodegenError",
    "ExportError",
    "TrainError",
    "TrainInterrupted",
    "AudioError",
]


class LinnetError(Exception):
    """The base of every error Linnet raises for bad input.

    Args:
        message: what went wrong, naming the file, field, tensor or option (lowercase, no
            trailing period, as diagnostics are written).
        code: the diagnostic code (`"L501"`), or None; rendered by `__str__` as `error[L501]: ...`.
    """

    def __init__(self, message: str = "", *, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return f"error[{self.code}]: {self.message}" if self.code else self.message


class SourceError(LinnetError):
    """The source does not check (the message holds the rendered diagnostics), declares no
    root model, or cannot be lowered under the requested config and sizes.

    Args:
        diagnostics: the `Diagnostic` values the message renders, when it renders some (a
            config.json key the source refuses, the checker's errors under a loaded config);
            empty otherwise.
    """

    def __init__(self, message: str = "", *, code: str | None = None, diagnostics: tuple = ()):
        super().__init__(message, code=code)
        self.diagnostics = tuple(diagnostics)


class ConfigError(SourceError):
    """A config value that does not fit the source's config type: a `--config` override, or a
    checkpoint's config.json / GGUF metadata field of the wrong kind. Names the field."""


class UnknownPreset(SourceError):
    """A preset the source does not declare, asked for by name (`--preset nope`, `load(preset=...)`): on the
    command line a usage error (exit 2), as `linnet check --preset nope` is. The message lists the presets."""


class LoadError(LinnetError):
    """A model cannot be loaded: a source or config error met while loading, checkpoint names
    or shapes that don't match the source (codes L502, L501), no weights given where the preset
    names none, or random weights too big for memory. The message names the file, field or
    tensor (and both shapes)."""


class CheckpointError(LoadError):
    """A checkpoint that cannot be opened or read. The message names the path (or embedded id)
    and what was expected or what is wrong: missing path, no config.json, pickle-only weights,
    truncated or corrupt file, unknown tensor name, unsupported GGUF architecture or type."""


class BackendError(LinnetError):
    """What a backend cannot run here: a mode, device, dtype or numerics it does not support,
    a missing provider or framework, ops without kernels in the model's dtype; or a bad
    backend argument. The message says what is supported."""


class RunError(LinnetError, ValueError):
    """An entry called with inputs that don't fit it: the wrong number of arrays, a rank, dim or
    dtype its signature refuses, or rows and positions outside the KV cache. Names the input."""


class CodegenError(LinnetError):
    """An op, dtype or argument a code generator (PyTorch, JAX) or exporter (ONNX) cannot
    express. Names the op."""


class ExportError(LinnetError):
    """A model that a checkpoint format (`linnet export hf`, `linnet export gguf`) cannot express: a family
    without an entry in the format, a config value it has no key for, a tokenizer it cannot hold, or an
    output folder or file that already exists. Names the family, field or path; nothing is left on disk."""


class TrainError(LinnetError):
    """A training run that cannot start or go on (`linnet train`, `linnet.train`): a data row missing a field or
    holding the wrong type (names the file, line and field), a LoRA target pattern that matches no `Linear`
    member (lists them), a backend that does not train, a method's option out of range, a reward function that
    raises. Nothing is left half-written in the output folder."""


class TrainInterrupted(LinnetError):
    """A training run stopped by a signal (SIGTERM, SIGHUP, SIGINT): `signum` the signal, `step` the last optimizer
    step trained (0: none), `checkpoint` the `checkpoint-N` folder holding it (None when nothing was saved).
    `linnet train` exits 128 + `signum`, as a shell reports a process the signal ended."""

    def __init__(self, message: str, *, signum: int, step: int = 0, checkpoint=None):
        super().__init__(message)
        self.signum, self.step, self.checkpoint = signum, step, checkpoint


class AudioError(LinnetError):
    """An audio input that cannot be used: a missing or unreadable file, a file that is not a WAV, a sample format
    other than 8/16/32-bit integer PCM, or a sampling rate the features cannot be made at. Names the path and says
    what the file holds and what is taken."""
