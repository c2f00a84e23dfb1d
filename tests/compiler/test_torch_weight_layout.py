"""Where the generated PyTorch module holds its wide linear weights transposed (`fusion.hold_wide_weights_transposed`,
`LinnetModule.bind`): under `fast`, on the CPU, decoding at most 2 rows at once, f32 weights [N, K] with N > K that
only linear layers and row lookups read. The values are the checkpoint's, only the memory order differs, so the
model must decode as the `equivalent` one does (to f32 rounding) and hand its weights back unchanged."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

# hidden 32, intermediate 64, vocab 96: gate and up ([64, 32] each, one [128, 32] joined), q, k and v ([32 + 16 + 16,
# 32] joined) and the tied embedding (the head, [96, 32]) are wide; o and down are not
LLAMA = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=96, tie_word_embeddings=True)  # fmt: skip
GROUPS = [
    tuple(f"model.layers.{i}.{m}.weight" for m in members)
    for i in range(2)
    for members in (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj"))
]
WIDE = {p for group in GROUPS for p in group} | {"model.embed_tokens.weight"}


def load(numerics: str, max_batch: int = 1, mode: str = "generated", dtype: str = "f32"):
    from linnet.torch import load
    from tests.conftest import EXAMPLES

    return load(EXAMPLES / "llama.linnet", config=LLAMA, numerics=numerics, max_batch=max_batch, mode=mode,
                dtype=dtype, max_positions=32, random_weights=True, seed=3, progress=False)  # fmt: skip


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_fast_holds_the_wide_linear_weights_transposed():
    module = load("fast").module
    assert module.stored_transposed == WIDE
    joined = {p: sum(module.tensors[m].shape[0] for m in group) for group in GROUPS for p in group}
    for path, tensor in module.tensors.items():
        if path in WIDE:
            assert tensor.stride() == (1, joined.get(path, tensor.shape[0])), path
        else:
            assert tensor.is_contiguous(), path


@pytest.mark.parametrize(("max_batch", "transposed"), [(1, True), (3, False)])
def test_the_weights_one_linear_layer_reads_lie_in_one_buffer(max_batch, transposed):
    """q, k and v (gate and up) are one `linears` in a `fast` module on the CPU: each group's weights are the
    rows of one buffer ([K, sum N] in memory where the group is held transposed), under their own names."""
    module = load("fast", max_batch).module
    assert "linears(" in module.source
    assert sorted(set(module.weight_groups.values())) == sorted(GROUPS)
    for group in GROUPS:
        tensors = [module.tensors[p] for p in group]
        first = tensors[0]
        assert {t.untyped_storage().data_ptr() for t in tensors} == {first.untyped_storage().data_ptr()}
        step = first.stride(0) * first.element_size()
        starts = np.cumsum([0] + [t.shape[0] for t in tensors[:-1]])
        assert [t.data_ptr() - first.data_ptr() for t in tensors] == [int(n) * step for n in starts]
        assert all((t.stride() == (1, int(starts[-1]) + tensors[-1].shape[0])) == transposed for t in tensors)
    assert set(dict(module.state_dict()).keys()) >= {p for group in GROUPS for p in group}


@pytest.mark.parametrize(
    ("numerics", "mode", "dtype"),
    [("equivalent", "generated", "f32"), ("fast", "interpret", "f32"), ("fast", "generated", "bf16")],
)  # fmt: skip
def test_elsewhere_each_linear_layer_reads_its_own_weight(numerics, mode, dtype):
    """`equivalent` keeps transformers' kernels; the interpreter calls F.linear; in bf16 the joined GEMV gained
    nothing measurable eagerly."""
    module = load(numerics, mode=mode, dtype=dtype).module
    assert module.weight_groups == {}
    assert "linears(" not in module.source


@pytest.mark.parametrize(
    ("numerics", "max_batch", "mode"),
    [("equivalent", 1, "generated"), ("fast", 3, "generated"), ("fast", 1, "interpret"), ("fast", 1, "inductor")],
)
def test_elsewhere_every_weight_keeps_the_checkpoint_layout(numerics, max_batch, mode):
    """`equivalent` keeps transformers' kernels; from 3 rows a step the transposed layout is slower; the
    interpreter calls F.linear and inductor compiles its own kernels."""
    module = load(numerics, max_batch, mode).module
    assert module.stored_transposed == frozenset()
    assert all(t.is_contiguous() for t in module.tensors.values())


@pytest.mark.parametrize("max_batch", [1, 2])
def test_a_fast_module_decodes_as_the_equivalent_one(two_threads, max_batch):
    """A prefill and decode steps (two rows at different positions where the module takes two), with the wide
    weights transposed and run as blocks of K: the equivalent module's logits and greedy tokens, to f32 rounding."""
    fast, equivalent = load("fast", max_batch), load("equivalent", max_batch)
    assert fast.module.stored_transposed == WIDE
    rows = np.arange(max_batch)
    prompts = np.random.default_rng(0).integers(0, 96, size=(max_batch, 7))
    outs = {}
    for name, model in (("fast", fast), ("equivalent", equivalent)):
        step = model.step_model()
        logits = [step.step(prompts, np.zeros(max_batch, dtype=np.int64), rows)]
        positions = np.arange(7, 7 + max_batch)  # each row one position further on
        for _ in range(6):
            tokens = logits[-1].argmax(-1)[:, None]
            logits.append(step.step(tokens, positions, rows))
            positions = positions + 1
        outs[name] = np.stack(logits)
    np.testing.assert_allclose(outs["fast"], outs["equivalent"], rtol=1e-5, atol=1e-5)
    assert (outs["fast"].argmax(-1) == outs["equivalent"].argmax(-1)).all()


def test_an_untied_embedding_and_a_model_without_state_keep_the_checkpoint_layout():
    """A table only looked up gains nothing from the layout; an encoder alone runs any batch (its `forward` is not
    bounded by `max_batch`), where blocks of K are slower."""
    from linnet.torch import load
    from tests.conftest import EXAMPLES

    untied = load(EXAMPLES / "llama.linnet", config={**LLAMA, "tie_word_embeddings": False}, numerics="fast",
                  max_positions=32, random_weights=True, progress=False).module  # fmt: skip
    assert untied.stored_transposed == (WIDE - {"model.embed_tokens.weight"}) | {"lm_head.weight"}
    assert untied.tensors["model.embed_tokens.weight"].is_contiguous()
    bert = load(EXAMPLES / "bert.linnet", config={"num_hidden_layers": 1, "hidden_size": 16, "intermediate_size": 64,
                "num_attention_heads": 2, "vocab_size": 64}, numerics="fast", random_weights=True,
                progress=False).module  # fmt: skip
    assert not bert.program.state and bert.stored_transposed == frozenset()


def test_the_weights_come_back_as_the_checkpoint_holds_them():
    """Exports read the parameters (`model_weights`): the same values, in [N, K] order, whatever the memory."""
    from linnet.runtimes.model_weights import model_weights

    fast, equivalent = model_weights(load("fast")), model_weights(load("equivalent"))
    assert fast.keys() == equivalent.keys()
    for path in fast:
        assert fast[path].shape == equivalent[path].shape
        assert np.array_equal(fast[path], equivalent[path]), path


def test_a_weight_bound_again_leaves_the_tensors_handed_out_before_unchanged(two_threads):
    """Binding k_proj a second time (a new checkpoint, an adapter merged) starts a new buffer for q, k and v: the
    tensors read before keep their values, the module decodes with the new k as an `equivalent` module does."""
    fast, equivalent = load("fast"), load("equivalent")
    q, k = GROUPS[0][0], GROUPS[0][1]
    before = {p: fast.module.tensors[p] for p in (q, k)}
    kept = {p: t.clone() for p, t in before.items()}
    new_k = torch.randn(fast.module.tensors[k].shape, generator=torch.Generator().manual_seed(5))
    for model in (fast, equivalent):
        model.module.bind(k, new_k)
    for p in (q, k):
        assert torch.equal(before[p], kept[p]), p
    assert torch.equal(fast.module.tensors[k], new_k) and torch.equal(fast.module.tensors[q], kept[q])
    tensors = [fast.module.tensors[p] for p in GROUPS[0]]
    assert [t.data_ptr() - tensors[0].data_ptr() for t in tensors] == [0, 32 * 4, 48 * 4]  # one buffer again
    prompt = np.random.default_rng(1).integers(0, 96, size=(1, 5))
    zero = np.zeros(1, dtype=np.int64)
    outs = [model.step_model().step(prompt, zero, zero) for model in (fast, equivalent)]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_binding_one_weight_keeps_the_values_others_were_given_another_way():
    """q replaced through `load_state_dict(assign=True)` (not `bind`), then k bound: the new buffer holds q's
    current value, not the one the old buffer held, and the module computes what an `equivalent` one does."""
    fast, equivalent = load("fast"), load("equivalent")
    q, k = GROUPS[0][0], GROUPS[0][1]
    generator = torch.Generator().manual_seed(7)
    new_q = torch.randn(fast.module.tensors[q].shape, generator=generator)
    new_k = torch.randn(fast.module.tensors[k].shape, generator=generator)
    for model in (fast, equivalent):
        model.module.load_state_dict({q: new_q.clone()}, strict=False, assign=True)
        model.module.bind(k, new_k)
    assert torch.equal(fast.module.tensors[q], new_q) and torch.equal(fast.module.tensors[k], new_k)
    prompt = np.random.default_rng(2).integers(0, 96, size=(1, 5))
    zero = np.zeros(1, dtype=np.int64)
    outs = [model.step_model().step(prompt, zero, zero) for model in (fast, equivalent)]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def assert_adjacent(module, group):
    tensors = [module.tensors[p] for p in group]
    step = tensors[0].stride(0) * tensors[0].element_size()
    starts = np.cumsum([0] + [t.shape[0] for t in tensors[:-1]])
    assert [t.data_ptr() - tensors[0].data_ptr() for t in tensors] == [int(n) * step for n in starts]


@pytest.mark.parametrize(("numerics", "dtype"), [("equivalent", "f32"), ("equivalent", "bf16"), ("fast", "bf16")])
def test_an_inductor_module_lays_each_group_out_in_one_buffer(numerics, dtype):
    """Its compiled decode step reads q, k and v (gate and up) as one reduction over their buffer
    (the prelude's `linears_joined_under_compile`, which its code calls as `linears`), in the checkpoint's layout,
    under the checkpoint's names."""
    from linnet.compiler.torch.prelude import linears_joined_under_compile

    module = load(numerics, mode="inductor", dtype=dtype).module
    assert "linears(" in module.source
    assert type(module.root).forward.__globals__["linears"] is linears_joined_under_compile
    assert sorted(module._joined_groups) == sorted(GROUPS)
    for group in GROUPS:
        assert_adjacent(module, group)
    assert all(t.is_contiguous() for t in module.tensors.values())
    assert set(dict(module.state_dict()).keys()) >= {p for group in GROUPS for p in group}
    assert module.weight_groups_joined()


def test_a_weight_rebound_apart_is_laid_out_again_with_its_values():
    """A compiled trace cannot read addresses, so before each compiled call the module checks that each group still
    lies in one buffer: a weight registered anew (as a trainer or an adapter does) is copied into a new buffer
    with the group's current values; one that requires grad is left alone, and the entry then runs eagerly."""
    module = load("equivalent", mode="inductor").module
    group = GROUPS[0]
    owner, leaf = module._leaves[group[1]]
    fresh = torch.randn(module.tensors[group[1]].shape, generator=torch.Generator().manual_seed(5))
    before = {p: module.tensors[p].clone() for p in group}
    owner.register_parameter(leaf, torch.nn.Parameter(fresh.clone(), requires_grad=False))
    registered = getattr(owner, leaf)
    with torch.inference_mode():  # as the step model calls it
        assert module.weight_groups_joined()
    assert_adjacent(module, group)
    assert getattr(owner, leaf) is registered  # the same object: a handle the caller holds still reaches the model
    for p in group:
        expected = fresh if p == group[1] else before[p]
        assert torch.equal(getattr(*module._leaves[p]), expected), p
        assert module.tensors[p] is getattr(*module._leaves[p])
        assert not module.tensors[p].is_inference()  # still loadable and trainable outside inference mode
    module.load_state_dict({p: before[p] for p in group}, strict=False)
    assert_adjacent(module, group)

    held = torch.nn.Parameter(fresh.clone(), requires_grad=True)
    owner.register_parameter(leaf, held)
    assert module.weight_groups_joined()  # a trace that computes gradients reads each weight apart
    with torch.no_grad():
        assert not module.weight_groups_joined()  # one that does not would read the group as one buffer
    assert getattr(owner, leaf) is held  # the trainer's parameter stays its own
    held.requires_grad_(False)
    assert module.weight_groups_joined()
    assert_adjacent(module, group)


def test_a_replaced_submodule_is_seen():
    """The check looks the weights up from the root, as the generated code reads them: a new attention module's
    weights are laid out in one buffer before a compiled call."""
    import copy

    module = load("equivalent", mode="inductor").module
    assert module.weight_groups_joined()
    layer = module.root.model.layers[0]
    fresh = copy.deepcopy(layer.self_attn)
    for name in ("q_proj", "k_proj", "v_proj"):
        sub = getattr(fresh, name)
        sub.weight = torch.nn.Parameter(sub.weight.detach().clone() + 1, requires_grad=False)
    layer.self_attn = fresh
    assert module.weight_groups_joined()
    assert module.tensors[GROUPS[0][0]] is fresh.q_proj.weight
    assert_adjacent(module, GROUPS[0])


def test_an_inductor_prefill_keeps_the_generated_modules_bits():
    """Eager calls of an inductor module keep one `linear` a weight (`linears`' `joined_under_compile`): joined,
    gate's and up's outputs were strided views, and silu over them moved the last bit where intermediate_size % 32
    == 16."""
    from linnet.torch import load as load_model
    from tests.conftest import EXAMPLES

    config = dict(num_hidden_layers=2, hidden_size=48, intermediate_size=80, num_attention_heads=3,
                  num_key_value_heads=1, vocab_size=100, tie_word_embeddings=False)  # fmt: skip
    logits = {}
    for mode in ("inductor", "generated"):
        model = load_model(EXAMPLES / "llama.linnet", config=config, numerics="equivalent", mode=mode,
                           max_positions=64, random_weights=True, seed=3, progress=False)  # fmt: skip
        prompt = np.random.default_rng(0).integers(0, 100, size=(1, 17))
        logits[mode] = model.step_model().step(prompt, np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    assert np.array_equal(logits["inductor"], logits["generated"])


def test_a_trace_reads_a_group_joined_only_without_gradients_and_in_one_layout():
    """The condition a compiled trace joins a group under (`_read_joined`, as the prelude's `linears` checks it): no
    gradient to any weight wanted, and one layout (a transposed group is read one `linear` a weight)."""
    from linnet.compiler.torch.module import _read_joined

    module = load("equivalent", mode="inductor").module
    weights = [module.tensors[p] for p in GROUPS[0]]
    assert _read_joined(weights)
    with torch.no_grad():
        assert _read_joined([torch.nn.Parameter(w.detach(), requires_grad=True) for w in weights])
    assert not _read_joined([torch.nn.Parameter(w.detach(), requires_grad=True) for w in weights])
    assert not _read_joined([w.t() for w in weights])


def test_the_compiled_step_reads_the_groups_current_values(two_threads):
    """Inductor's decode steps with each group read as one buffer give the generated module's logits; after a
    weight of a group is registered anew with other values (in both modules), and after one that requires grad,
    they still do: the stale buffer is never read."""
    import torch._dynamo

    torch._dynamo.reset()
    compiled, eager = load("equivalent", mode="inductor"), load("equivalent")
    prompt = np.array([[3, 14, 15, 92, 65]])

    def run(model, start):
        step = model.step_model()
        out = [step.step(prompt, np.array([0]), np.array([0]))]
        for i in range(3):
            out.append(step.step(out[-1].argmax(-1)[:, None], np.array([start + i]), np.array([0])))
        return np.stack(out)

    np.testing.assert_allclose(run(compiled, 5), run(eager, 5), rtol=1e-4, atol=1e-4)
    shape = compiled.module.tensors[GROUPS[0][1]].shape
    fresh = torch.randn(shape, generator=torch.Generator().manual_seed(7))
    for requires_grad in (False, True):
        for model in (compiled, eager):
            owner, leaf = model.module._leaves[GROUPS[0][1]]
            owner.register_parameter(leaf, torch.nn.Parameter(fresh.clone(), requires_grad=requires_grad))
        with torch.no_grad():
            np.testing.assert_allclose(run(compiled, 5), run(eager, 5), rtol=1e-4, atol=1e-4)
        fresh = fresh * 2


@pytest.mark.parametrize("mode", ["generated", "inductor"])
def test_a_deep_copy_keeps_each_group_in_one_buffer(mode):
    """`nn.Parameter` deep-copies each weight apart; the module's copy lays its groups back into the copied buffer,
    so it runs as the original does (bit for bit under `fast`, where the group is read as one linear)."""
    import copy

    from linnet.compiler.torch.module import _adjacent

    original = load("fast", mode=mode).module
    twin = copy.deepcopy(original)
    for group in GROUPS:
        assert _adjacent([twin.tensors[p] for p in group]), group
        assert twin.tensors[group[0]].data_ptr() != original.tensors[group[0]].data_ptr()
    ids = torch.tensor([[3, 14, 15]])
    with torch.inference_mode():
        assert torch.equal(twin.step(ids, torch.tensor([0]), torch.tensor([0])),
                           original.step(ids, torch.tensor([0]), torch.tensor([0])))  # fmt: skip
