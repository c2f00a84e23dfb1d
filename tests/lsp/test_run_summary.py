"""The one line the editor shows for a `linnet.run` report (`linnet.lsp.views.summary`)."""

from __future__ import annotations

from linnet.lsp import views


def test_an_empty_output_is_summarised_without_values():
    """`linnet run --format json` gives null summary values for an output with a zero-sized dim (a config size of
    0 checks); the line says `empty` where it would format them."""
    report = {
        "entry": "forward",
        "backend": "torch",
        "outputs": [
            {"shape": [1, 0], "dtype": "float32", "mean": None, "std": None, "min": None, "max": None},
            {"shape": [1, 2], "dtype": "float32", "mean": 0.5, "std": 0.25, "min": 0.0, "max": 1.0},
        ],
        "time_ms": 1.0,
    }
    line = views.summary(report)
    assert "[1, 0] float32 (empty); [1, 2] float32 (mean 0.5, std 0.25, min 0, max 1)" in line
