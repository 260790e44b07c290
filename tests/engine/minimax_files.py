"""MiniMax-H3 test files: diffusers' MiniMaxH3Transformer3DModel state dict (or its shapes) back in the release's names.

The inverse of diffusers' `convert_minimax_h3_transformer_checkpoint_to_diffusers` (single_file_utils.py, its default
"stacked" q / k / v layout), written here from its facts: `transformer_blocks.` / `token_refiner.refiner_blocks.` <->
`blocks.` / `token_refiner.blocks.`; `proj_in` / `audio_proj_in` / `context_embedder` <-> `video_patch_proj` /
`audio_patch_proj` / `condition_proj`; `time_embedder.linear_1` / `linear_2` <-> `proj_in` / `proj_out`; `norm_out.norm`
/ `norm_out.linear` / `proj_out` / `audio_proj_out` <-> `final_layer.norm` / `final_layer.adaln_proj.linear` /
`final_layer.video_out` / `final_layer.audio_out`; in a block `attn.norm_q` / `norm_k` / `to_out.0` <-> `attn.q_norm` /
`k_norm` / `out_proj`, `ff.net.0.proj` / `ff.net.2` <-> `mlp.fc1` / `fc2`, q / k / v stacked into `attn.qkv_proj`, and
fc1's halves held [gate; value] where diffusers' SwiGLU reads [value; gate].
"""

from __future__ import annotations

_TOP = {"proj_in.": "video_patch_proj.", "audio_proj_in.": "audio_patch_proj.", "context_embedder.": "condition_proj.",
        "time_embedder.linear_1.": "time_embedder.proj_in.", "time_embedder.linear_2.": "time_embedder.proj_out.",
        "norm_out.norm.": "final_layer.norm.", "norm_out.linear.": "final_layer.adaln_proj.linear.",
        "proj_out.": "final_layer.video_out.", "audio_proj_out.": "final_layer.audio_out.",
        "transformer_blocks.": "blocks.", "token_refiner.refiner_blocks.": "token_refiner.blocks."}  # fmt: skip
_BLOCK = {".attn.norm_q.": ".attn.q_norm.", ".attn.norm_k.": ".attn.k_norm.", ".attn.to_out.0.": ".attn.out_proj.",
          ".ff.net.0.proj.": ".mlp.fc1.", ".ff.net.2.": ".mlp.fc2."}  # fmt: skip


def release_key(k: str) -> str:
    for a, b in _TOP.items():
        if k.startswith(a):
            k = b + k[len(a) :]
            break
    for a, b in _BLOCK.items():
        k = k.replace(a, b)
    return k


def to_release(sd: dict) -> dict:
    """diffusers' state dict (tensors, or shapes) in the release's names: q / k / v stacked, fc1's halves swapped."""
    import torch

    out = {}
    for k, v in sd.items():
        if k.endswith((".attn.to_k.weight", ".attn.to_v.weight")):
            continue
        if k.endswith(".attn.to_q.weight"):
            parts = [sd[k.replace(".to_q.", f".to_{n}.")] for n in "qkv"]
            fused = torch.cat(parts) if hasattr(v, "chunk") else (3 * v[0], *v[1:])
            out[release_key(k).replace(".attn.to_q.", ".attn.qkv_proj.")] = fused
            continue
        if k.endswith(".ff.net.0.proj.weight") and hasattr(v, "chunk"):
            value, gate = v.chunk(2, dim=0)
            v = torch.cat([gate, value])
        out[release_key(k)] = v
    return out


def config(**kw) -> dict:
    """A reduced MiniMaxH3Transformer3DModel config: 2 blocks, 1 refiner block, 2 heads of 32 over a 48-wide stream
    (heads x head wider than the stream, as the release's 56 x 128 over 5376), 2 x 4 rotary frequencies per axis."""
    base = dict(num_attention_heads=2, attention_head_dim=32, hidden_size=48, num_layers=2, num_refiner_layers=1,
                ffn_dim=64, in_channels=4, audio_in_channels=8, text_dim=40, freq_dim=32, time_embed_hidden_dim=56,
                time_embed_dim=24, rope_freq_dim=4)  # fmt: skip
    return {**base, **kw}
