"""Semantics: names and scopes, the dim algebra, type/shape/dtype inference, configs and
presets, diagnostics. `program.Document` is the entry point; `checker.ItemChecker` checks one
item under one config."""
