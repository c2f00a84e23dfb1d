"""Shrunk checkpoints of the zoo's families for the porting suite, made as the parity tests make theirs: the reference
library's class built from a small config with a fixed seed, every parameter perturbed off its init (norm scales
off 1, biases off 0, so a dropped norm weight or bias shows), saved with `save_pretrained` into a folder that Linnet
loads through its real loading path. Nothing is fetched.

`FAMILIES` maps each family (the example's file stem) to (library, class, config). The configs follow
tests/runtimes/test_parity_*.py's small ones, with 2 layers where the family allows.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import EXAMPLES

_DECODER = dict(vocab_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                max_position_embeddings=128, rms_norm_eps=1e-5, initializer_range=0.1)  # fmt: skip

FAMILIES: dict[str, tuple[str, str, dict]] = {
    "llama": ("transformers", "LlamaForCausalLM", dict(
        _DECODER, hidden_size=64, intermediate_size=96, num_attention_heads=4, rope_theta=100.0,
        tie_word_embeddings=False)),
    "mistral": ("transformers", "MistralForCausalLM", dict(
        _DECODER, hidden_size=64, intermediate_size=128, head_dim=8, sliding_window=6,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0}, bos_token_id=0, eos_token_id=1,
        pad_token_id=None)),
    "qwen2": ("transformers", "Qwen2ForCausalLM", dict(
        _DECODER, hidden_size=64, intermediate_size=128, rope_theta=100.0, tie_word_embeddings=True)),
    "qwen3": ("transformers", "Qwen3ForCausalLM", dict(
        _DECODER, hidden_size=48, intermediate_size=96, head_dim=8, rope_theta=100.0, tie_word_embeddings=False)),
    "phi3": ("transformers", "Phi3ForCausalLM", dict(
        _DECODER, hidden_size=64, intermediate_size=96, original_max_position_embeddings=16, rope_theta=100.0,
        bos_token_id=0, eos_token_id=1, pad_token_id=None, partial_rotary_factor=0.5, sliding_window=6,
        max_position_embeddings=64,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.7], "long_factor": [2.5, 9.0]})),
    "gpt2": ("transformers", "GPT2LMHeadModel", dict(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4)),
    "bert": ("transformers", "BertModel", dict(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=40, type_vocab_size=2, pad_token_id=0, attn_implementation="eager")),
    "roberta": ("transformers", "RobertaModel", dict(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=40, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, initializer_range=0.1, attn_implementation="eager")),
    "modernbert": ("transformers", "ModernBertModel", dict(
        vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, global_attn_every_n_layers=2, local_attention=4, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, initializer_range=0.1,
        global_rope_theta=1000.0, local_rope_theta=50.0, attn_implementation="eager")),
    "vit": ("transformers", "ViTForImageClassification", dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, image_size=32,
        patch_size=8, num_labels=5, layer_norm_eps=1e-6)),
    "dinov2": ("transformers", "Dinov2Model", dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=3, image_size=32, patch_size=8,
        layerscale_value=0.5, attn_implementation="eager")),
    "resnet": ("transformers", "ResNetForImageClassification", dict(
        layer_type="basic", embedding_size=8, hidden_sizes=[8, 16], depths=[2, 2], num_labels=5)),
    "siglip": ("transformers", "SiglipModel", dict(
        text_config=dict(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=16, projection_size=32, pad_token_id=1,
                         bos_token_id=2, eos_token_id=3),
        vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8),
        attn_implementation="eager")),
    "sam": ("transformers", "SamModel", dict(
        vision_config=dict(hidden_size=32, output_channels=16, num_hidden_layers=2, num_attention_heads=4,
                           image_size=64, patch_size=8, window_size=3, global_attn_indexes=[1], num_pos_feats=8,
                           mlp_dim=48),
        prompt_encoder_config=dict(hidden_size=16, image_size=64, patch_size=8, mask_input_channels=8),
        mask_decoder_config=dict(hidden_size=16, mlp_dim=32, num_hidden_layers=2, num_attention_heads=2,
                                 iou_head_hidden_dim=16),
        attn_implementation="eager")),
    "gpt_oss": ("transformers", "GptOssForCausalLM", dict(
        _DECODER, hidden_size=64, intermediate_size=32, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=6, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32},
        bos_token_id=0, eos_token_id=1, pad_token_id=None, attn_implementation="eager")),
    "whisper": ("transformers", "WhisperForConditionalGeneration", dict(
        vocab_size=100, num_mel_bins=16, d_model=32, encoder_layers=2, encoder_attention_heads=4,
        encoder_ffn_dim=48, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=48,
        max_source_positions=24, max_target_positions=40, pad_token_id=90, bos_token_id=90, eos_token_id=90,
        decoder_start_token_id=91, begin_suppress_tokens=None, suppress_tokens=None, attn_implementation="eager")),
    "autoencoder_kl": ("diffusers", "AutoencoderKL", dict(
        block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, norm_num_groups=4, latent_channels=4,
        sample_size=32)),
    "unet_2d_condition": ("diffusers", "UNet2DConditionModel", dict(
        sample_size=8, block_out_channels=(8, 16), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), layers_per_block=2, attention_head_dim=(1, 2),
        transformer_layers_per_block=(1, 2), cross_attention_dim=12, norm_num_groups=4, use_linear_projection=True,
        addition_embed_type="text_time", addition_time_embed_dim=8, projection_class_embeddings_input_dim=10 + 6 * 8)),
}  # fmt: skip


def source(family: str) -> Path:
    """The shipped source of `family`: examples/<family>.linnet."""
    return EXAMPLES / f"{family}.linnet"


def build(family: str, folder: Path):
    """Make the shrunk checkpoint of `family` in `folder` (seeded, perturbed, `save_pretrained`); returns the
    reference model it was saved from, in eval mode."""
    import importlib

    import torch

    from tests.runtimes.conftest import perturb

    library, cls_name, values = FAMILIES[family]
    lib = importlib.import_module(library)
    cls = getattr(lib, cls_name)
    torch.manual_seed(0)
    if library == "diffusers":
        model = cls(**values)
    else:
        config = lib.AutoConfig.for_model(family, **values)
        model = cls(config, add_pooling_layer=False) if family == "roberta" else cls(config)
    model = model.eval()
    perturb(model, seed=2)
    model.save_pretrained(folder)
    return model
