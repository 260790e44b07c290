"""FLUX.3 test files: diffusers' Flux3Transformer2DModel state dict (or its shapes) back in BFL's names.

The inverse of diffusers' `convert_flux3_transformer_checkpoint_to_diffusers` (single_file_utils.py), written here
from its facts: module prefixes `emb_in.` / `txt_in.` / `content_mode_blocks.` / `single_blocks.` <-> `x_embedders.` /
`context_embedder.` / `mode_blocks.` / `single_transformer_blocks.`; inside a block `q_proj` / `k_proj` / `v_proj` /
`attn_out` / `norm.query_norm.scale` / `norm.key_norm.scale` / `mlp_in` / `mlp_out` <-> `attn.to_q` ... `ff.linear_out`;
the modulations' `.lin` <-> `.linear`; `time_in` / `ref_time_in` (in_layer, out_layer) <-> `timestep_embedder` /
`target_timestep_embedder` (linear_1, linear_2); `final_layer.image.linear` <-> `proj_out` and
`final_layer.image.adaLN_modulation.1` <-> `norm_out.linear` with its (shift, scale) halves swapped.
"""

from __future__ import annotations

_PREFIX = {"x_embedders.": "emb_in.", "context_embedder.": "txt_in.", "mode_blocks.": "content_mode_blocks.",
           "single_transformer_blocks.": "single_blocks."}  # fmt: skip
_BLOCK = {"attn.to_q.weight": "q_proj.weight", "attn.to_k.weight": "k_proj.weight", "attn.to_v.weight": "v_proj.weight",
          "attn.to_out.0.weight": "attn_out.weight", "attn.norm_q.weight": "norm.query_norm.scale",
          "attn.norm_k.weight": "norm.key_norm.scale", "ff.linear_in.weight": "mlp_in.weight",
          "ff.linear_out.weight": "mlp_out.weight"}  # fmt: skip
_EXACT = {"timestep_embedder.linear_1.weight": "time_in.in_layer.weight",
          "timestep_embedder.linear_2.weight": "time_in.out_layer.weight",
          "target_timestep_embedder.linear_1.weight": "ref_time_in.in_layer.weight",
          "target_timestep_embedder.linear_2.weight": "ref_time_in.out_layer.weight",
          "proj_out.weight": "final_layer.image.linear.weight",
          "norm_out.linear.weight": "final_layer.image.adaLN_modulation.1.weight"}  # fmt: skip


def bfl_key(k: str) -> str:
    if k in _EXACT:
        return _EXACT[k]
    for a, b in _PREFIX.items():
        if k.startswith(a):
            k = b + k[len(a) :]
            break
    k = k.replace(".linear.weight", ".lin.weight")
    for a, b in _BLOCK.items():
        if k.endswith(a):
            return k[: -len(a)] + b
    return k


def to_bfl(sd: dict) -> dict:
    """diffusers' state dict (tensors, or shapes) in BFL's names; the final modulation's halves swapped back."""
    out = {}
    for k, v in sd.items():
        if k == "norm_out.linear.weight" and hasattr(v, "chunk"):
            scale, shift = v.chunk(2, dim=0)
            v = __import__("torch").cat([shift, scale], dim=0)
        out[bfl_key(k)] = v
    return out


def config(**kw) -> dict:
    """A reduced Flux3Transformer2DModel config: 1 per-mode block of each mode, 2 single blocks, 2 heads of 128."""
    base = dict(in_channels=32, cond_in_channels=32, num_layers=1, num_single_layers=2, attention_head_dim=128,
                num_attention_heads=2, joint_attention_dim=96, timestep_channels=256)  # fmt: skip
    return {**base, **kw}
