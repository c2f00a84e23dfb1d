"""The sweep that shows a checkpoint config is never silently wrong (issue 14): for each example family (Llama, GPT-2,
BERT, RoBERTa, ModernBERT, Mistral, Qwen2, Qwen3), a small seeded checkpoint made by transformers has ONE config key
changed at a time (every key of its config.json, nested `rope_parameters` fields one by one, plus keys other models
of the family write, such as Phi-3's `partial_rotary_factor`). The reference is what transformers makes of that
config.json: the config is read back with `from_pretrained`, a model is built from it (seeded, parameters perturbed)
and its weights saved beside the mutated config.json. Linnet loads the folder through `linnet.runtimes`
(torch-interpret) and must either refuse it with an error naming the key, or give the reference's outputs within f32
tolerance.

Each mutation is one of: refused (naming the key), matched, invalid (transformers itself refuses the config), or a
failure: silently wrong (loaded, outputs differ) or refused without naming the key. The counts are printed
(`pytest -s`) and the failures listed."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.runtimes.conftest import (
    BERT,
    GPT2,
    GPT_OSS,
    LLAMA,
    MISTRAL,
    MODERNBERT,
    QWEN2,
    QWEN3,
    ROBERTA,
    max_abs_diff,
    perturb,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import linnet.torch as lt  # noqa: E402
from linnet.errors import LinnetError  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

ATOL = 1e-4  # f32 against transformers in eager f32; the parity tests see ~1e-6 on models this small
SEQ = 12
MAX_POSITIONS = 32


@dataclass
class Family:
    source: Path
    config_class: str
    model_class: str
    base: dict  # the small config's arguments
    extra: dict = field(default_factory=dict)  # keys the saved config.json lacks, to be added one at a time
    encoder: bool = False  # outputs are last_hidden_state (inputs: ids and an attention mask), not logits


# The sizes of the small decoders (Llama, Mistral, Qwen2, Qwen3): GQA 4/2.
SMALL_DECODER = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
)

# The sizes of the small encoders (BERT, RoBERTa).
SMALL_ENCODER = dict(
    vocab_size=96,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=MAX_POSITIONS,
)

FAMILIES = {
    "llama": Family(
        LLAMA,
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            SMALL_DECODER,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 100.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
            tie_word_embeddings=False,
        ),
        # Phi-3 writes `partial_rotary_factor` (transformers 5 reads it from rope_parameters for every model);
        # Mistral and Qwen2 write `sliding_window`.
        extra={"rope_parameters.partial_rotary_factor": 0.5, "partial_rotary_factor": 0.5, "sliding_window": 4},
    ),
    "mistral": Family(
        MISTRAL,
        "MistralConfig",
        "MistralForCausalLM",
        dict(
            SMALL_DECODER,
            rope_parameters={"rope_type": "default", "rope_theta": 100.0},
            sliding_window=4,  # shorter than the sweep's 12 tokens, so a window ignored or changed shows
        ),
        # Qwen2 writes `max_window_layers` and `use_sliding_window` (windows in some layers only).
        extra={"rope_parameters.partial_rotary_factor": 0.5, "max_window_layers": 1, "use_sliding_window": True},
    ),
    "gpt_oss": Family(
        GPT_OSS,
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            SMALL_DECODER,
            intermediate_size=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=4,  # shorter than the sweep's 12 tokens
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 100.0,
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 16,
            },
        ),
        # YaRN's optional keys (DeepSeek writes the mscales); the original release's own spellings, which
        # transformers does not read.
        extra={
            "rope_parameters.attention_factor": 1.3,
            "rope_parameters.mscale": 0.9,
            "experts_per_token": 3,
            "initial_context_length": 8,
        },
    ),
    "gpt2": Family(
        GPT2,
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=MAX_POSITIONS, bos_token_id=0, eos_token_id=1),
        extra={"n_inner": 48, "n_ctx": 64},
    ),
    "bert": Family(
        BERT,
        "BertConfig",
        "BertModel",
        SMALL_ENCODER,
        extra={"position_embedding_type": "relative_key", "gradient_checkpointing": True},
        encoder=True,
    ),
    # The sliding-window keys are inert while `use_sliding_window` is false (the one value the sources take): a
    # window size must leave the outputs as they are. (Layer types naming sliding layers with no window is a config
    # transformers itself cannot run.)
    "qwen2": Family(
        QWEN2,
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(SMALL_DECODER, rope_parameters={"rope_type": "default", "rope_theta": 100.0}, tie_word_embeddings=True),
        extra={"sliding_window": 4, "head_dim": 16},
    ),
    "qwen3": Family(
        QWEN3,
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(SMALL_DECODER, rope_parameters={"rope_type": "default", "rope_theta": 100.0}, head_dim=16),
        extra={"sliding_window": 4},
    ),
    "roberta": Family(
        ROBERTA,
        "RobertaConfig",
        "RobertaModel",
        dict(SMALL_ENCODER, type_vocab_size=1, layer_norm_eps=1e-5),
        extra={"position_embedding_type": "relative_key"},
        encoder=True,
    ),
    # 3 layers, global every 2nd (full, sliding, full), a window of 2 on each side; the rope thetas as transformers
    # 5 writes them (`rope_parameters` per attention type) and, as extra keys, as configs before it did.
    "modernbert": Family(
        MODERNBERT,
        "ModernBertConfig",
        "ModernBertModel",
        dict(
            SMALL_ENCODER,
            num_hidden_layers=3,
            global_attn_every_n_layers=2,
            local_attention=4,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            cls_token_id=1,
            sep_token_id=2,
            global_rope_theta=1000.0,
            local_rope_theta=50.0,
        ),
        extra={
            "rope_parameters.sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
            "rope_parameters.full_attention.rope_type": "linear",
            "global_rope_theta": 5000.0,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        },
        encoder=True,
    ),
}

# Another valid value for keys whose generic change (below) would not be valid or would not tell.
CHANGED = {
    "hidden_act": "relu",
    "activation_function": "relu",
    "rope_type": "linear",
    "model_type": "mistral",
    "architectures": ["LlamaModel"],
    "dtype": "bfloat16",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0",
    "pad_token_id": 2,
    "hidden_activation": "relu",
}


def changed(key: str, value):
    """Another valid value for `key`: from CHANGED, else by kind: a bool flipped, an id moved by one, a size
    doubled, a float changed by far more than f32 tolerance (an epsilon ignored must show), a string's other
    spelling; None for values with nothing sensible to change to."""
    leaf = key.rsplit(".", 1)[-1]
    if leaf in CHANGED:
        return CHANGED[leaf]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1 if leaf.endswith("_id") else value * 2
    if isinstance(value, float):
        return value * 2 + 0.25
    if value is None:
        return 3 if leaf.endswith("_id") else None
    return None


def mutations(config: dict, extra: dict) -> list[tuple[str, object]]:
    """(dotted key, new value) for every key of `config` (nested dicts field by field) and every extra key."""
    out = []
    for key, value in config.items():
        if isinstance(value, dict):
            out += [(f"{key}.{k}", changed(k, v)) for k, v in value.items()]
        else:
            out.append((key, changed(key, value)))
    return [(k, v) for k, v in out if v is not None] + list(extra.items())


def with_key(config: dict, dotted: str, value) -> dict:
    out = copy.deepcopy(config)
    *parents, leaf = dotted.split(".")
    node = out
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return out


def build_reference(family: Family, config_json: dict, folder: Path):
    """What transformers makes of `config_json`: the config read back from the folder, a seeded model built from
    it (parameters perturbed, in f32) and saved there; config.json is then the mutated text exactly."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_json, indent=2))
    config = getattr(transformers, family.config_class).from_pretrained(folder)
    torch.manual_seed(0)
    model = getattr(transformers, family.model_class)(config).float().eval()
    perturb(model, seed=1)
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config_json, indent=2))
    return model


def outputs(family: Family, model, ids: torch.Tensor, mask: torch.Tensor, linnet: bool):
    with torch.inference_mode():
        if linnet:
            return model.native.forward(ids, mask) if family.encoder else model.native.forward(ids)
        if family.encoder:
            return model(input_ids=ids, attention_mask=mask, return_dict=True).last_hidden_state
        return model(input_ids=ids, return_dict=True).logits


def names_key(message: str, dotted: str) -> bool:
    """The error names the key: `partial_rotary_factor`, `rope_scaling.factor` for `rope_parameters.factor`
    (config.json's rotary block is read as rope_theta and rope_scaling), or the field it sets."""
    leaf = dotted.rsplit(".", 1)[-1]
    return f"`{leaf}`" in message or f".{leaf}`" in message or f'"{leaf}"' in message


def inputs(family: Family) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of token ids and their attention mask (the second row padded: an encoder must honour it)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, family.base["vocab_size"], (2, SEQ), generator=g)
    mask = torch.ones_like(ids)
    mask[1, SEQ - 3 :] = 0
    return ids, mask


def base_config(family: Family, folder: Path) -> dict:
    """The config.json transformers writes for the family's small config."""
    getattr(transformers, family.config_class)(**family.base).save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


def outcome(family: Family, source: Path | str, base_json: dict, key: str, value, folder: Path) -> tuple[str, str]:
    """(outcome, detail) of one mutation: "invalid", "refused", "matched", "silently wrong" or
    "refused, key not named"."""
    ids, mask = inputs(family)
    try:
        reference = build_reference(family, with_key(base_json, key, value), folder)
        expected = outputs(family, reference, ids, mask, linnet=False)
    except Exception as err:  # transformers refuses this config: not a mutation Linnet has to answer
        return "invalid", f"transformers refuses it ({type(err).__name__}: {str(err).splitlines()[-1][:160]})"
    try:
        model = lt.load(source, weights=folder, mode="interpret", max_positions=MAX_POSITIONS, progress=False)
    except LinnetError as err:
        return ("refused", "") if names_key(str(err), key) else ("refused, key not named", str(err))
    got = outputs(family, model, ids, mask, linnet=True)
    if family.encoder:  # padded positions are not outputs
        keep = mask.bool()
        got, expected = got[keep], expected[keep]
    delta = max_abs_diff(got, expected)
    return ("matched", "") if delta <= ATOL else ("silently wrong", f"max|Δ| = {delta:.3e} from transformers")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_one_config_key_changed_is_refused_by_name_or_exact(name, tmp_path):
    family = FAMILIES[name]
    base_json = base_config(family, tmp_path / "base")
    counts = dict.fromkeys(("tried", "refused", "matched", "invalid", "silently wrong", "refused, key not named"), 0)
    failures = []
    for i, (key, value) in enumerate(mutations(base_json, family.extra)):
        result, detail = outcome(family, family.source, base_json, key, value, tmp_path / f"m{i}")
        counts[result] += 1
        counts["tried"] += result != "invalid"
        if result == "invalid":
            print(f"{name}: {key} = {value!r}: {detail}")
        elif result not in ("refused", "matched"):
            failures.append(f"{key} = {value!r}: {result}: {detail}")
    print(f"config sweep {name}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    assert counts["tried"] >= 15, counts
    assert counts["matched"] > 0 and counts["refused"] > 0, counts  # both outcomes really occur
    assert not failures, "\n".join(failures)


def test_the_sweep_sees_a_key_the_source_ignores(tmp_path):
    """The sweep can fail: with `hidden_act` declared inert instead of `"silu"`-typed (what the 'ignored' note
    amounted to before), a Llama config.json saying "relu" loads and is counted silently wrong."""
    family = FAMILIES["llama"]
    text = LLAMA.read_text(encoding="utf-8")
    text = text.replace('@inert("initializer_range"', '@inert("hidden_act", "initializer_range"', 1)
    text = text.replace('    hidden_act: "silu" = "silu"\n', "", 1)
    source = tmp_path / "llama_ignoring_hidden_act.linnet"
    source.write_text(text, encoding="utf-8")
    base_json = base_config(family, tmp_path / "base")
    assert outcome(family, family.source, base_json, "hidden_act", "relu", tmp_path / "m")[0] == "refused"
    result, detail = outcome(family, source, base_json, "hidden_act", "relu", tmp_path / "m2")
    assert result == "silently wrong", (result, detail)
