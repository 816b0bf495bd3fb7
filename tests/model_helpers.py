"""Small models the tests build (shared by the real-model and head-training tests)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=6,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=256, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, tie_word_embeddings=True,
                         bos_token_id=257, eos_token_id=258, pad_token_id=256)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial norm weights, so a norm applied twice or skipped shows
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model
