"""Every GGUF metadata key is read, or known not to change the computation, or refused by name (issue 14, the
GGUF half of item 3): a llama.cpp-layout file with one key added at a time."""

from __future__ import annotations

import pytest

from linnet.runtimes.formats.checkpoints import CheckpointError, open_checkpoint
from linnet.runtimes.formats.gguf import GGUF_KEYS_NEUTRAL_VALUE, GGUF_KEYS_WITHOUT_EFFECT
from tests.runtimes.gguf_writing import write_llama_gguf

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def written(tmp_path, model, extra=None):
    path = tmp_path / "m.gguf"
    write_llama_gguf(path, model, extra_metadata=extra)
    return path


def refusal(tmp_path, model, extra) -> str:
    path = written(tmp_path, model, extra)
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(path)
    assert str(path) in str(e.value)
    return str(e.value)


def test_the_keys_llamacpp_writes_are_all_read(tmp_path, model):
    with open_checkpoint(written(tmp_path, model)) as ckpt:
        c = ckpt.config
        assert (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (32, 4, 2, 8)
        assert c["vocab_size"] == 32 and c["max_position_embeddings"] == 64 and c["rope_scaling"] is None


@pytest.mark.parametrize(
    "key, value",
    [
        ("llama.attention.layer_norm_epsilon", 1e-5),  # LayerNorm, not the RMS epsilon the source reads
        ("llama.expert_feed_forward_length", 64),
        ("llama.attention.causal", False),
        ("llama.tensor_data_layout", "Meta AI original pth"),
        ("llama.use_parallel_residual", True),
        ("mystery.key", 1),  # outside every namespace
    ],
)
def test_unread_keys_are_refused_by_name(tmp_path, model, key, value):
    message = refusal(tmp_path, model, {key: value})
    assert f"{key!r}" in message and "may change the computation" in message


def test_a_sliding_window_is_read_and_a_source_without_one_refuses_it(tmp_path, model):
    """`llama.attention.sliding_window` (what Linnet's export writes for Mistral) is read as `sliding_window`:
    examples/mistral.linnet takes it; examples/llama.linnet has no such field, so loading refuses it (L503) rather
    than running plain causal attention."""
    import linnet.torch as lt
    from linnet.errors import LoadError
    from tests.runtimes.conftest import LLAMA

    path = written(tmp_path, model, {"llama.attention.sliding_window": 16})
    with open_checkpoint(path) as ckpt:
        assert ckpt.config["sliding_window"] == 16
    with pytest.raises(LoadError, match=r"error\[L503\]: `sliding_window`"):
        lt.load(LLAMA, weights=path, max_positions=32, progress=False)


@pytest.mark.parametrize("key", sorted(GGUF_KEYS_NEUTRAL_VALUE))
def test_neutral_keys_are_read_with_their_neutral_value_only(tmp_path, model, key):
    neutral = GGUF_KEYS_NEUTRAL_VALUE[key]
    with open_checkpoint(written(tmp_path, model, {f"llama.{key}": neutral})) as ckpt:
        assert ckpt.config["hidden_size"] == 32
    other = type(neutral)(8 if isinstance(neutral, int) else 1.5)
    message = refusal(tmp_path, model, {f"llama.{key}": other})
    assert f"llama.{key} = {other!r}" in message and "changes the computation" in message


@pytest.mark.parametrize("key", sorted(GGUF_KEYS_WITHOUT_EFFECT))
def test_keys_without_effect_are_accepted(tmp_path, model, key):
    value = True if key.endswith("finetuned") else 32 if key.endswith("context_length") else 1.0
    with open_checkpoint(written(tmp_path, model, {f"llama.{key}": value})) as ckpt:
        assert ckpt.config["rope_scaling"] is None


def test_provenance_namespaces_are_accepted(tmp_path, model):
    extra = {"general.name": "tiny", "quantize.imatrix.dataset": "wiki", "split.count": 1}
    with open_checkpoint(written(tmp_path, model, extra)) as ckpt:
        assert ckpt.config["num_hidden_layers"] == 1


def test_split_files_are_refused(tmp_path, model):
    assert "llama-gguf-split --merge" in refusal(tmp_path, model, {"split.count": 3})


@pytest.mark.parametrize("kind", ["yarn", "longrope", "llama3"])
def test_rope_scaling_types_other_than_linear_are_refused(tmp_path, model, kind):
    message = refusal(tmp_path, model, {"llama.rope.scaling.type": kind, "llama.rope.scaling.factor": 4.0})
    assert f"llama.rope.scaling.type = {kind!r} is not supported" in message


@pytest.mark.parametrize(
    "extra, scaling",
    [
        ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}, {"rope_type": "linear", "factor": 2}),
        ({"llama.rope.scale_linear": 4.0}, {"rope_type": "linear", "factor": 4.0}),  # llama.cpp's older key
        ({"llama.rope.scaling.type": "none", "llama.rope.scaling.factor": 2.0}, None),
        ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 1.0}, None),
    ],
)
def test_linear_rope_scaling(tmp_path, model, extra, scaling):
    with open_checkpoint(written(tmp_path, model, extra)) as ckpt:
        assert ckpt.config["rope_scaling"] == scaling


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("llama.rope.dimension_count", 4, "llama.rope.dimension_count = 4 differs from the head size 8"),
        ("llama.attention.value_length", 16, "llama.attention.value_length = 16 differs from the head size 8"),
        ("llama.vocab_size", 40, "llama.vocab_size = 40 but tokenizer.ggml.tokens lists 32 tokens"),
    ],
)
def test_contradicting_keys_are_refused(tmp_path, model, key, value, words):
    extra = {key: value, "tokenizer.ggml.tokens": [f"t{i}" for i in range(32)]}
    assert words in refusal(tmp_path, model, extra)


@pytest.mark.parametrize("attention_bias, mlp_bias", [(True, False), (False, True), (True, True)])
def test_biases_are_read_from_the_tensors(tmp_path, attention_bias, mlp_bias):
    """llama.cpp's llama graph adds the attention and feed-forward biases a file has; so does Linnet, exactly."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import linnet.torch as lt
    from tests.runtimes.conftest import LLAMA, LOGITS_ATOL, max_abs_diff, perturb

    config = LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=attention_bias,
        mlp_bias=mlp_bias,
    )
    torch.manual_seed(1)
    ref = LlamaForCausalLM(config).eval()
    perturb(ref, seed=2, scale=0.2)  # biases start at zero
    path = written(tmp_path, ref)
    with open_checkpoint(path) as ckpt:
        # set only for the biases the file has (a source without the field reads a file without them)
        assert (ckpt.config.get("attention_bias", False), ckpt.config.get("mlp_bias", False)) == (
            attention_bias,
            mlp_bias,
        )
        assert ("attention_bias" in ckpt.config, "mlp_bias" in ckpt.config) == (attention_bias, mlp_bias)
    m = lt.load(LLAMA, weights=path, max_positions=16, progress=False)
    x = torch.randint(0, 32, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        assert max_abs_diff(torch.from_numpy(m.forward(x.numpy())), ref(input_ids=x).logits) < LOGITS_ATOL


# -- the sweep: each key llama.cpp writes, and the rope keys it may write, changed one at a time ----------------

# (GGUF key, another valid value, the transformers LlamaConfig change that computes the same, or None when the
# change cannot describe these weights and Linnet must refuse)
MUTATIONS = [
    ("llama.context_length", 32, {"max_position_embeddings": 32}),
    ("llama.embedding_length", 64, None),
    ("llama.feed_forward_length", 96, None),
    ("llama.block_count", 1, None),
    ("llama.attention.head_count", 8, None),
    ("llama.attention.head_count_kv", 4, None),
    ("llama.attention.head_count_kv", 1, None),
    ("llama.rope.freq_base", 500.0, {"rope_theta": 500.0}),
    ("llama.attention.layer_norm_rms_epsilon", 0.5, {"rms_norm_eps": 0.5}),
    ("llama.rope.dimension_count", 4, None),
    ("llama.attention.key_length", 16, None),
    ("llama.attention.value_length", 4, None),
    ("llama.vocab_size", 64, None),
    ("general.file_type", 1, {}),
    ("llama.rope.scaling.type", "none", {}),
    ("llama.rope.scaling.factor", 2.0, {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("llama.rope.scale_linear", 3.0, {"rope_scaling": {"rope_type": "linear", "factor": 3.0}}),
    ("llama.rope.scaling.type", "yarn", None),
    ("llama.rope.scaling.attn_factor", 2.0, None),
    ("llama.expert_count", 4, None),
    ("llama.attention.layer_norm_epsilon", 1e-5, None),
]


def test_sweep_every_key_is_refused_or_exact(tmp_path):
    """Each mutation is refused with an error naming the key or the tensor it breaks, or gives the logits of
    transformers' model built from the mutated config with the same weights. Silently wrong: none."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import linnet.torch as lt
    from linnet.errors import LinnetError
    from tests.runtimes.conftest import LLAMA, LOGITS_ATOL, max_abs_diff, perturb

    base = {
        "vocab_size": 32,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "rope_theta": 10000.0,
    }
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**base)).eval()
    perturb(model, seed=1, scale=0.3)
    x = torch.randint(0, 32, (1, 24), generator=torch.Generator().manual_seed(2))
    counts = {"refused": 0, "matched": 0, "silently wrong": 0}
    wrong = []
    for i, (key, value, change) in enumerate(MUTATIONS):
        path = tmp_path / f"m{i}.gguf"
        write_llama_gguf(path, model, extra_metadata={key: value})
        try:
            m = lt.load(LLAMA, weights=path, max_positions=32, progress=False)
            ours = torch.from_numpy(m.forward(x.numpy()))
        except LinnetError as e:
            counts["refused"] += 1
            assert str(path) in str(e) or "don't match" in str(e), (key, str(e))
            if change is not None:
                wrong.append(f"{key} = {value!r} refused, though transformers computes it: {e}")
            continue
        if change is None:
            counts["silently wrong"] += 1
            wrong.append(f"{key} = {value!r} loaded, though no config computes these weights with it")
            continue
        config = LlamaConfig(**{**base, **change})
        reference = LlamaForCausalLM(config).eval()
        reference.load_state_dict(model.state_dict())
        with torch.inference_mode():
            delta = max_abs_diff(ours, reference(input_ids=x).logits)
        if delta < LOGITS_ATOL:
            counts["matched"] += 1
        else:
            counts["silently wrong"] += 1
            wrong.append(f"{key} = {value!r}: logits off by {delta:.3g}")
    print(f"GGUF key sweep, {len(MUTATIONS)} mutations tried: {counts}")
    assert not wrong, "\n".join(wrong)
    assert counts["silently wrong"] == 0 and counts["matched"] >= 5 and counts["refused"] >= 10


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("llama.rope.freq_base", "fast", "llama.rope.freq_base is 'fast', expected a finite number"),
        ("llama.attention.head_count", 0, "llama.attention.head_count is 0, expected a positive integer"),
        ("llama.attention.head_count_kv", [2, 1], "llama.attention.head_count_kv is a list of 2 values"),
        ("llama.rope.scaling.type", 1, "llama.rope.scaling.type is 1, expected a string"),
        ("llama.attention.layer_norm_rms_epsilon", True, "expected a finite number"),
    ],
)
def test_values_of_the_wrong_type_are_refused(tmp_path, model, key, value, words):
    assert words in refusal(tmp_path, model, {key: value})


def test_per_layer_arrays_with_one_value_are_read(tmp_path, model):
    with open_checkpoint(written(tmp_path, model, {"llama.attention.head_count_kv": [2]})) as ckpt:
        assert ckpt.config["num_key_value_heads"] == 2
