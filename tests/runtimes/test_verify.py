"""`linnet.runtimes.verify` (the Python API of `linnet verify`): every example at every preset, shrunk (2 layers,
widths of tens: `verify_sizes`), agrees with itself on seeded random weights; a shrunk Whisper saved by transformers
agrees on its own weights; and each porting mistake of the kinds verify is for, applied to a shipped source, parts
naming the check, the entries, the first position and the first module (the member, for a norm dropped from one
entry).

The mutations are real edits of the shipped sources (one line replaced), so each test fails on the unmutated
source: `test_every_example_agrees_with_itself` is its control."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.runtimes.verify_sizes import SHRUNK, presets, source

torch = pytest.importorskip("torch")

from linnet.runtimes.verify import NothingToCompare, verify  # noqa: E402

pytestmark = pytest.mark.torch

CASES = [(family, preset) for family in SHRUNK for preset in presets(family)]


@pytest.mark.parametrize(("family", "preset"), CASES, ids=[f"{f}-{p}" for f, p in CASES])
def test_every_example_agrees_with_itself(family, preset):
    config, dims = SHRUNK[family]
    report = verify(source(family), preset=preset, config=config, dims=dims)
    assert report.checks
    assert report.agree, report.format_text()


def test_a_transformers_checkpoint_agrees_with_itself(tmp_path):
    """Whisper's five checks on the weights transformers saved (every parameter perturbed), not random ones."""
    pytest.importorskip("transformers")
    from tests.runtimes.whisper_checkpoint import save_small_whisper

    save_small_whisper(tmp_path)
    report = verify(source("whisper"), tmp_path)
    kinds = sorted(c.kind for c in report.checks)
    assert kinds == ["batch", "batch", "batch", "cache", "same result"], report.format_text()
    assert report.agree, report.format_text()
    assert report.weights == str(tmp_path)


@dataclass
class Mutation:
    """One line of a shipped source replaced (`old` must occur `count` times), and what verify must say: the kind
    and entries of the first check that parts, the first module whose outputs part, the first position (or row) of
    that module's difference, and the parameters read by one way only."""

    family: str
    old: str
    new: str
    kind: str
    ways: tuple[str, str]
    module: str
    position: int
    count: int = 1
    before: str | None = None
    read_by_one_way: dict = field(default_factory=dict)


LLAMA_STEP_MASK = "let mask = causal_mask(position_ids, arange(S))"
MUTATIONS = {
    "norm dropped from forward only": Mutation(
        "llama",
        "let x = h + self_attn(input_layernorm(h), cos, sin, mask)",
        "let x = h + self_attn(h, cos, sin, mask)",
        "cache", ("forward", "step"), "model.layers.0", 0, before="model.layers.0.self_attn",
        read_by_one_way={"step": ["model.layers.0.input_layernorm.weight", "model.layers.1.input_layernorm.weight"]},
    ),
    "cache written one position late": Mutation(
        "llama",
        "k_cache = cache_write(k_cache, rows, positions, k)",
        "k_cache = cache_write(k_cache, rows, positions + 1, k)",
        "cache", ("forward", "step"), "model.layers.0.self_attn", 1,
    ),
    "causal mask ignored in forward": Mutation(
        "llama", LLAMA_STEP_MASK, "let mask = causal_mask(position_ids + S, arange(S))",
        "cache", ("forward", "step"), "model.layers.0.self_attn", 0,
    ),
    "cache written into row 0 whatever the row": Mutation(
        "llama",
        "k_cache = cache_write(k_cache, rows, positions, k)",
        "k_cache = cache_write(k_cache, rows * 0, positions, k)",
        "batch", ("step", "step"), "model.layers.0.self_attn", 0,
    ),
    "rotary positions offset in step": Mutation(
        "llama",
        "let position_ids = unsqueeze(positions, 1) + arange(S)",
        "let position_ids = unsqueeze(positions, 1) + arange(S) + 1",
        "cache", ("forward", "step"), "model", 0, before="model.rotary()",
    ),
    "padding mask ignored": Mutation(
        "bert",
        "encoder(embeddings(input_ids), padding_mask(attention_mask))",
        "encoder(embeddings(input_ids), padding_mask(attention_mask + 1))",
        "padding", ("forward", "forward"), "encoder.layer.0.attention.self", 0,
    ),
    "batch-dependent op": Mutation(
        "llama",
        "        let h = embed_tokens(input_ids)\n",
        "        let h = embed_tokens(input_ids) - mean(embed_tokens(input_ids), dim=0, keepdim=true)\n",
        "batch", ("forward", "forward"), "model", 0, count=2, before="model.layers.0",
    ),
    "decoder step without its final norm (encoder-decoder)": Mutation(
        "whisper",
        "            h = layer.step(h, mask, positions, rows)\n        }\n        layer_norm(h)",
        "            h = layer.step(h, mask, positions, rows)\n        }\n        h",
        "cache", ("forward", "step"), "model.decoder", 0,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_a_porting_mistake_is_caught(name, tmp_path):
    m = MUTATIONS[name]
    text = source(m.family).read_text()
    assert text.count(m.old) == m.count, f"{m.family}: the mutated line is not in the source as written"
    mutated = tmp_path / f"{m.family}.linnet"
    mutated.write_text(text.replace(m.old, m.new))
    config, dims = SHRUNK[m.family]
    report = verify(mutated, preset=presets(m.family)[0], config=config, dims=dims)
    part = report.first_part
    assert part is not None, report.format_text()
    assert (part.kind, part.ways) == (m.kind, m.ways), report.format_text()
    assert part.module is not None and part.module.path == m.module, report.format_text()
    assert part.module.position == m.position, report.format_text()
    assert part.module.before == m.before, report.format_text()
    assert part.max_delta > part.tolerance or part.read_by_one_way
    for reader, paths in m.read_by_one_way.items():
        assert part.read_by_one_way[reader] == paths, report.format_text()


def test_a_model_without_a_pair_to_compare_is_refused(tmp_path):
    fixed = tmp_path / "fixed.linnet"
    fixed.write_text(
        "config C {\n    n: int = 4\n}\n\nmodel Fixed(c: C) {\n    w: Linear(c.n, 2)\n\n"
        "    entry fn forward(x: [4, c.n]) -> [4, 2] {\n        w(x)\n    }\n}\n"
    )
    with pytest.raises(NothingToCompare, match="no pair of computations to compare"):
        verify(fixed)


@pytest.mark.slow  # SmolLM2 135M at its real size: 30 layers, ~30 s on 2 busy cores
def test_smollm2_from_the_embedded_gguf_agrees_with_itself():
    report = verify(source("llama"), "smollm2-135m-instruct")
    assert [c.kind for c in report.checks] == ["cache", "batch", "batch"]
    assert report.agree, report.format_text()


@pytest.mark.slow  # transformers builds and saves each family's checkpoint: ~5-10 s a family
@pytest.mark.parametrize(
    "family", ["llama", "mistral", "qwen2", "qwen3", "gpt_oss", "gpt2", "bert", "roberta", "modernbert"]
)
def test_a_zoo_familys_transformers_checkpoint_agrees_with_itself(family, tmp_path):
    """The config sweep's shrunk checkpoint of each family (tests/runtimes/test_config_sweep.py: made by
    transformers, seeded, every parameter perturbed) verified on its own weights."""
    pytest.importorskip("transformers")
    from tests.runtimes.test_config_sweep import FAMILIES, base_config, build_reference

    spec = FAMILIES[family]
    build_reference(spec, base_config(spec, tmp_path), tmp_path)
    report = verify(spec.source, tmp_path)
    assert report.checks and report.agree, report.format_text()
