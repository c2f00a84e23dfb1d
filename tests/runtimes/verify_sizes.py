"""The shrunk configs `linnet verify`'s tests run every example at: each family's `--config` overrides (2 layers,
widths of tens, a vocabulary of 256) applied on top of each of its presets, and the sizes of dim variables other than
the batch and the sequence (`--dim`)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT

EXAMPLES = ROOT / "examples"

_DECODER = {
    "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 256,
}  # fmt: skip
_ENCODER = {
    "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 256,
    "max_position_embeddings": 64,
}  # fmt: skip
_VIT = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "image_size": 32, "patch_size": 8}

# family -> (config overrides, dim sizes)
SHRUNK: dict[str, tuple[dict, dict]] = {
    "mlp": ({}, {}),
    "llama": (_DECODER, {}),
    "mistral": (_DECODER | {"sliding_window": 4}, {}),
    "qwen2": (_DECODER, {}),
    "qwen3": (_DECODER, {}),
    # Phi-3's rope scaling lists one factor per rotary frequency: head_dim 96 as in the real checkpoints
    "phi3": (_DECODER | {"hidden_size": 192, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 96}, {}),
    "gpt_oss": (
        _DECODER | {"intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 4},
        {},
    ),
    "gpt2": ({"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "n_positions": 64}, {}),
    "bert": (_ENCODER, {}),
    "roberta": (_ENCODER, {}),
    "modernbert": (
        _ENCODER | {"num_hidden_layers": 3, "intermediate_size": 96, "local_attention": 4},
        {},
    ),
    "whisper": (
        {
            "d_model": 64,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 128,
            "decoder_ffn_dim": 128,
            "vocab_size": 256,
            "num_mel_bins": 8,
            "max_source_positions": 16,
            "max_target_positions": 32,
        },
        {},
    ),  # fmt: skip
    "vit": (_VIT | {"intermediate_size": 128}, {}),
    "dinov2": (_VIT, {"H": 32, "W": 32}),
    "resnet": ({"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1]}, {"H": 32, "W": 32}),
    "autoencoder_kl": (
        {
            "block_out_channels": [16, 16],
            "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D"],
            "norm_num_groups": 8,
            "layers_per_block": 1,
        },
        {"H": 4, "W": 4},
    ),  # fmt: skip
    "siglip": (
        {
            "text_config": {
                "vocab_size": 256,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "max_position_embeddings": 16,
            },
            "vision_config": {
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "image_size": 32,
                "patch_size": 8,
            },
        },
        {},
    ),  # fmt: skip
    "sam": (
        {
            "vision_config": {
                "hidden_size": 32,
                "output_channels": 16,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "image_size": 64,
                "patch_size": 8,
                "window_size": 3,
                "global_attn_indexes": [1],
                "num_pos_feats": 8,
            },
            "prompt_encoder_config": {"hidden_size": 16, "image_size": 64, "patch_size": 8, "mask_input_channels": 4},
            "mask_decoder_config": {
                "hidden_size": 16,
                "mlp_dim": 32,
                "num_attention_heads": 2,
                "iou_head_hidden_dim": 16,
            },
        },
        {"P": 1, "N": 2},
    ),  # fmt: skip
    "unet_2d_condition": (
        {
            "block_out_channels": [32, 64],
            "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
            "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"],
            "layers_per_block": 1,
            "transformer_layers_per_block": [1, 1],
            "attention_head_dim": [8, 8],
            "norm_num_groups": 8,
            "cross_attention_dim": 32,
            "addition_time_embed_dim": 8,
            "projection_class_embeddings_input_dim": 80,
            "sample_size": 8,
        },
        {"N": 6},
    ),  # fmt: skip
}


def presets(family: str) -> list[str | None]:
    """The presets of `examples/<family>.linnet` (None: the config's defaults, for a source without presets)."""
    from linnet.ir.build import check_source, read_source

    checked = check_source(*read_source(EXAMPLES / f"{family}.linnet"))
    return list(checked.analysis.declared_presets) or [None]


def source(family: str) -> Path:
    return EXAMPLES / f"{family}.linnet"
