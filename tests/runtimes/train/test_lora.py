"""LoRA as a source transform on the shrunk Llama of conftest (f32, loaded from its save_pretrained folder):

- the transform: PEFT's default targets (q_proj, v_proj), B = 0 so the adapted model equals the base; target
  patterns as PEFT reads them; a pattern that matches nothing lists the Linear members;
- 20 steps of LoRA SFT against TRL 1.16 SFTTrainer on a PEFT 0.21 model started from the same adapter weights
  (PEFT draws A; Linnet loads that initial adapter folder): per-step losses;
- the adapter Linnet saves loads in `PeftModel.from_pretrained` with Linnet's logits, loads back into Linnet, and
  the merged export (`export_hf`'s writer) loads in transformers with the same logits;
- lora_dropout 0.1: 6 steps against TRL + PEFT drawing the same dropout masks (per-step losses within 2e-6);
  under gradient checkpointing the recomputed layers draw the masks of the forward.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtimes.train.conftest import COMMON, LLAMA, LOSS_ATOL, STEPS, id_rows, trl_sft_losses, write_jsonl

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import linnet  # noqa: E402
import linnet.torch as lt  # noqa: E402
from linnet.errors import TrainError  # noqa: E402
from linnet.runtimes.train import LoraSettings  # noqa: E402
from linnet.runtimes.train.lora import export_merged, load_with_adapters, save_adapter  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

IDS = np.array([[1, 5, 9, 22, 7, 100, 3, 64]])


def peft_model(folder, r=4, lora_alpha=8, lora_dropout=0.0):
    import transformers
    from peft import LoraConfig, get_peft_model

    base = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    torch.manual_seed(1)
    config = LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, task_type="CAUSAL_LM")
    return get_peft_model(base, config)


def test_default_targets_and_step_zero_equals_base(tiny_llama):
    model, paths = load_with_adapters(LLAMA, tiny_llama, LoraSettings(r=4, lora_alpha=8))
    assert [m.path for m in model.lora.members] == [
        f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "v_proj")
    ]
    q_proj = "model.layers.0.self_attn.q_proj"
    assert paths[:2] == [f"{q_proj}.lora_A.weight", f"{q_proj}.lora_B.weight"]
    state = model.module.state_dict()
    assert tuple(state[paths[0]].shape) == (4, 32) and not state[paths[1]].any()  # B = 0
    assert 0 < float(state[paths[0]].abs().max()) <= 1 / np.sqrt(32)  # A ~ U(-1/sqrt(in), 1/sqrt(in))
    base = lt.load(LLAMA, tiny_llama, progress=False)
    np.testing.assert_array_equal(model.forward(IDS)[0], base.forward(IDS)[0])


@pytest.mark.parametrize(
    ("targets", "expected"),
    [
        ("o_proj,down_proj", {"o_proj", "down_proj"}),
        (r"model\.layers\.\d+\.mlp\.(gate|up)_proj", {"gate_proj", "up_proj"}),
        ("all-linear", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
    ],
)
def test_target_patterns(tiny_llama, targets, expected):
    model, _ = load_with_adapters(LLAMA, tiny_llama, LoraSettings(r=2, targets=targets))
    assert {m.member for m in model.lora.members} == expected
    assert len(model.lora.members) == 2 * len(expected)  # every layer; never the head


def test_bad_targets(tiny_llama):
    with pytest.raises(TrainError, match=r"matches no Linear member of LlamaForCausalLM \(Linear members: q_proj "):
        load_with_adapters(LLAMA, tiny_llama, LoraSettings(targets="qkv"))
    with pytest.raises(TrainError, match=r"in some instances only \(not in model.layers.1.self_attn.q_proj\)"):
        load_with_adapters(LLAMA, tiny_llama, LoraSettings(targets=r"model\.layers\.0\.self_attn\.q_proj"))


def test_lora_sft_matches_trl_and_peft(tiny_llama, tmp_path):
    rows = id_rows(16)
    data = write_jsonl(tmp_path / "sft.jsonl", rows)
    reference = peft_model(tiny_llama)
    initial = tmp_path / "initial_adapter"
    reference.save_pretrained(initial)  # PEFT's A (seed 1) and B = 0: Linnet starts from the same weights
    out = tmp_path / "out"
    result = linnet.train(
        LLAMA, tiny_llama, data=data, output=out, adapter=initial, shuffle=False, progress=False, **COMMON
    )
    ours = [r["loss"] for r in result.history]
    theirs, _ = trl_sft_losses(reference, rows, COMMON)
    delta = max(abs(a - b) for a, b in zip(ours, theirs))
    print(f"LoRA SFT vs TRL + PEFT over {STEPS} steps: max |loss diff| {delta:.2e}")
    assert len(ours) == len(theirs) == STEPS
    assert delta < LOSS_ATOL, (ours, theirs)
    assert ours[-1] < ours[0] - 0.05

    # the adapter Linnet wrote loads in PEFT and gives Linnet's logits
    import transformers
    from peft import PeftModel

    base = transformers.LlamaForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, out).eval()
    ids = torch.tensor(IDS)
    with torch.no_grad():
        expected = loaded(input_ids=ids).logits.numpy()
        without = lt.load(LLAMA, tiny_llama, progress=False).forward(IDS)[0]
    got = result.model.forward(IDS)[0]
    print(f"Linnet vs PeftModel.from_pretrained logits: max |diff| {np.abs(got - expected).max():.2e}")
    assert np.abs(got - expected).max() < 1e-5
    assert np.abs(got - without).max() > 1e-3  # the adapters changed it

    # ... and back into Linnet
    again, _ = load_with_adapters(LLAMA, tiny_llama, None, adapter=out)
    np.testing.assert_allclose(again.forward(IDS)[0], got, atol=1e-6)

    # merged into the base through export_hf's writer: transformers gives the same logits
    export_merged(result.model, tmp_path / "merged")
    merged = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    with torch.no_grad():
        assert np.abs(merged(input_ids=ids).logits.numpy() - got).max() < 1e-5


def test_lora_dropout_sft_matches_trl_and_peft(tiny_llama, tmp_path, monkeypatch):
    """lora_dropout = 0.1: PEFT's `nn.Dropout` on each adapter's input, q_proj then v_proj layer by layer, and
    Linnet's generated `F.dropout(x, 0.1, self.training)` in the same order draw the same masks from torch's
    generator when it is in the same state: both seed it with 0 (TRL's `set_seed(args.seed)`, Linnet's `seed`),
    and TRL's DataLoader then draws one int64 from it when its iterator is made (the workers' base seed,
    torch/utils/data/dataloader.py `_BaseDataLoaderIter.__init__`), which the Linnet side draws too. Six steps,
    one epoch of 24 rows (a second epoch would draw again). B = 0 at step 1 and the learning rate 0 at step 1
    (warmup), so the masks show from step 3 on, where p = 0 differs by 3e-5."""
    from linnet.runtimes.train.trainer import Trainer

    real_train = Trainer.train

    def train_after_the_loader_draw(self):
        torch.empty((), dtype=torch.int64).random_()  # what TRL's DataLoader iterator draws
        return real_train(self)

    monkeypatch.setattr(Trainer, "train", train_after_the_loader_draw)
    rows = id_rows(24)
    options = {**COMMON, "max_steps": 6}
    data = write_jsonl(tmp_path / "sft.jsonl", rows)
    reference = peft_model(tiny_llama, lora_dropout=0.1)
    initial = tmp_path / "initial_adapter"
    reference.save_pretrained(initial)  # its adapter_config.json holds lora_dropout: Linnet takes it from there
    out = tmp_path / "out"
    result = linnet.train(
        LLAMA, tiny_llama, data=data, output=out, adapter=initial, shuffle=False, progress=False, seed=0, **options
    )
    ours = [r["loss"] for r in result.history]
    theirs, _ = trl_sft_losses(reference, rows, options)
    delta = max(abs(a - b) for a, b in zip(ours, theirs))
    print(f"LoRA SFT with lora_dropout 0.1 vs TRL + PEFT over 6 steps: max |loss diff| {delta:.2e}")
    assert len(ours) == len(theirs) == 6
    assert delta < 2e-6, (ours, theirs)  # measured 2.4e-7; without the same masks 1e-5 and more
    assert result.model.lora.settings.lora_dropout == 0.1
    assert "F.dropout(x, 0.1, self.training)" in result.model.module.source

    # inference is the identity: deterministic, and PEFT in eval mode gives the same logits
    import transformers
    from peft import PeftModel

    got = result.model.forward(IDS)[0]
    np.testing.assert_array_equal(result.model.forward(IDS)[0], got)
    base = transformers.LlamaForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, out).eval()
    assert loaded.peft_config["default"].lora_dropout == 0.1
    with torch.no_grad():
        assert np.abs(loaded(input_ids=torch.tensor(IDS)).logits.numpy() - got).max() < 1e-5
    result.model.module.train()  # training mode draws masks: the trained adapters' contribution changes
    with torch.no_grad():
        assert not torch.equal(result.model.native.forward(torch.tensor(IDS)), torch.from_numpy(got))
    result.model.module.eval()


def test_lora_dropout_under_gradient_checkpointing_recomputes_the_same_masks(tiny_llama, tmp_path):
    """Checkpointed layers run again in the backward pass, still in training mode and from the forward's random
    state (torch.utils.checkpoint keeps it): the same masks, so the same losses and gradient norms, bit for bit."""
    data = write_jsonl(tmp_path / "sft.jsonl", id_rows(16))
    runs = []
    for checkpointing in (False, True):
        result = linnet.train(
            LLAMA, tiny_llama, data=data, lora=LoraSettings(r=4, lora_alpha=8, lora_dropout=0.2), shuffle=False,
            progress=False, seed=0, gradient_checkpointing=checkpointing, **{**COMMON, "max_steps": 4},
        )  # fmt: skip
        runs.append([(r["loss"], r["grad_norm"]) for r in result.history])
    assert runs[0] == runs[1]


def test_adapters_disabled_is_the_base(tiny_llama, tmp_path):
    from linnet.runtimes.train.policy import TorchPolicy

    model, paths = load_with_adapters(LLAMA, tiny_llama, LoraSettings(r=4))
    with torch.no_grad():
        for p in paths:
            model.module.state_dict()[p].add_(0.1)  # B != 0: the adapters now change the output
    policy = TorchPolicy(model, paths)
    ids = torch.tensor(IDS)
    adapted = policy.logits(ids).detach()
    with torch.no_grad(), policy.adapters_disabled():
        off = policy.logits(ids)
    base = lt.load(LLAMA, tiny_llama, progress=False).native.forward(ids)
    assert torch.equal(off, base) and not torch.allclose(adapted, base)
    assert torch.equal(policy.logits(ids).detach(), adapted)  # the adapters are back
    save_adapter(model, tmp_path / "a")
    assert {f.name for f in (tmp_path / "a").iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}


def test_qwen2_adapters_on_biased_projections_load_in_peft(tmp_path):
    """Qwen2's q_proj and v_proj have biases (LoraLinear's `use_bias` branch); its MLP is llama.linnet's, imported,
    which the transform (a rewrite of the model's own file) refuses to adapt, saying where it is declared."""
    import transformers
    from peft import PeftModel

    from tests.runtimes.conftest import QWEN2

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
    )  # fmt: skip
    transformers.Qwen2ForCausalLM(config).save_pretrained(tmp_path / "qwen2")
    data = write_jsonl(tmp_path / "d.jsonl", id_rows(4))
    out = tmp_path / "out"
    result = linnet.train(
        QWEN2, tmp_path / "qwen2", data=data, output=out, max_steps=3, learning_rate=1e-2,
        per_device_train_batch_size=2, progress=False, lora=LoraSettings(r=4, lora_alpha=8),
    )  # fmt: skip
    assert {m.member for m in result.model.lora.members} == {"q_proj", "v_proj"}
    base = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "qwen2", dtype=torch.float32)
    with torch.no_grad():
        expected = PeftModel.from_pretrained(base, out).eval()(input_ids=torch.tensor(IDS)).logits.numpy()
    got = result.model.forward(IDS)[0]
    assert np.abs(got - expected).max() < 1e-5
    assert np.abs(got - lt.load(QWEN2, tmp_path / "qwen2", progress=False).forward(IDS)[0]).max() > 1e-4
    with pytest.raises(TrainError, match=r"LlamaMLP.gate_proj is declared in llama.linnet:\d+, not .*qwen2.linnet"):
        load_with_adapters(QWEN2, tmp_path / "qwen2", LoraSettings(targets="gate_proj"))


def _peft_adapter(tiny_llama, folder):
    peft_model(tiny_llama).save_pretrained(folder)
    return folder


def test_a_truncated_adapter_is_a_located_error(tiny_llama, tmp_path):
    """Half of adapter_model.safetensors (a copy cut short): PEFT itself cannot load it; Linnet says which file,
    as a TrainError (it was safetensors' SafetensorError, a traceback from `linnet train --adapter`)."""
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    from linnet.runtimes.train.lora import read_adapter

    folder = _peft_adapter(tiny_llama, tmp_path / "adapter")
    file = folder / "adapter_model.safetensors"
    data = file.read_bytes()
    for cut in (len(data) // 2, 4):
        file.write_bytes(data[:cut])
        with pytest.raises(Exception):  # noqa: B017 - PEFT's (safetensors') own error
            PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(tiny_llama), folder)
        with pytest.raises(TrainError) as e:
            read_adapter(folder)
        assert str(e.value).startswith(f"{file}: cannot read the adapter's tensors (")
        assert str(e.value).endswith("); the file is truncated or corrupt")


def test_an_adapter_holding_nan_is_refused_naming_the_tensor(tiny_llama, tmp_path):
    """NaN in lora_A trained to "loss nan" and exit 0; now the tensor and its first bad index are named."""
    from safetensors.numpy import load_file, save_file

    from linnet.runtimes.train.lora import read_adapter

    folder = _peft_adapter(tiny_llama, tmp_path / "adapter")
    file = folder / "adapter_model.safetensors"
    tensors = load_file(str(file))
    name = sorted(n for n in tensors if "lora_A" in n)[0]
    tensors[name][1, 2] = np.nan
    save_file(tensors, str(file), metadata={"format": "pt"})
    with pytest.raises(TrainError) as e:
        read_adapter(folder)
    assert str(e.value) == (
        f"{file}: tensor {name!r} holds NaN (1 of {tensors[name].size} values, the first nan at index [1, 2]); "
        "the adapter is corrupt or was saved after training diverged"
    )


@pytest.mark.parametrize("r", [None, "4", 0, 2.5, True])
def test_an_adapter_config_without_a_usable_rank_is_refused(tiny_llama, tmp_path, r):
    import json

    from linnet.runtimes.train.lora import read_adapter

    folder = _peft_adapter(tiny_llama, tmp_path / "adapter")
    config = json.loads((folder / "adapter_config.json").read_text())
    config["r"] = r
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(TrainError, match=r"adapter_config.json: r = .*; r must be an integer >= 1"):
        read_adapter(folder)


def test_the_cli_exits_with_one_line_for_a_truncated_adapter(tiny_llama, tmp_path, capsys):
    from linnet.cli import main
    from tests.runtimes.train.conftest import id_rows

    folder = _peft_adapter(tiny_llama, tmp_path / "adapter")
    file = folder / "adapter_model.safetensors"
    file.write_bytes(file.read_bytes()[:100])
    data = write_jsonl(tmp_path / "d.jsonl", id_rows(3))
    args = ["train", str(LLAMA), "--weights", str(tiny_llama), "--data", str(data), "--adapter", str(folder)]
    code = main([*args, "-o", str(tmp_path / "out"), "--max-steps", "1"])
    err = capsys.readouterr().err
    assert code in (1, 2) and "Traceback" not in err and f"{file}: cannot read the adapter's tensors" in err, err
    assert not (tmp_path / "out").exists()
