"""Semantics: names and scopes, type/shape/dtype inference, configs and presets, diagnostics
(the dim algebra lives in `linnet.types`). `program.Document` is the entry point; `checker.ItemChecker` checks one
item under one config."""
