"""HunyuanVideo 1.0 and 1.5 test weights: reduced models of diffusers' classes with well-scaled random weights,
and their state dicts in Tencent's release names and ComfyUI's (the inverse of diffusers' converters)."""

from __future__ import annotations

import torch
from denoise_files import well_scaled


def diffusers_hunyuan(seed: int = 8, guidance: bool = True):
    """A reduced HunyuanVideo (width 256: 2 heads of 128, 2 double and 2 single blocks, 2 refiner blocks,
    4 latent channels, 64-wide text states, a 32-wide pooled vector) in diffusers' class, well-scaled random
    weights: (model, its state dict)."""
    from diffusers import HunyuanVideoTransformer3DModel

    model = HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=128, num_layers=2,
        num_single_layers=2, num_refiner_layers=2, text_embed_dim=64, pooled_projection_dim=32,
        guidance_embeds=guidance,
    )  # fmt: skip
    return well_scaled(model, seed)


_TOP = {
    "x_embedder.proj.": "img_in.proj.",
    "time_text_embed.timestep_embedder.linear_1.": "time_in.mlp.0.",
    "time_text_embed.timestep_embedder.linear_2.": "time_in.mlp.2.",
    "time_text_embed.guidance_embedder.linear_1.": "guidance_in.mlp.0.",
    "time_text_embed.guidance_embedder.linear_2.": "guidance_in.mlp.2.",
    "time_text_embed.text_embedder.linear_1.": "vector_in.in_layer.",
    "time_text_embed.text_embedder.linear_2.": "vector_in.out_layer.",
    "context_embedder.proj_in.": "txt_in.input_embedder.",
    "context_embedder.time_text_embed.timestep_embedder.linear_1.": "txt_in.t_embedder.mlp.0.",
    "context_embedder.time_text_embed.timestep_embedder.linear_2.": "txt_in.t_embedder.mlp.2.",
    "context_embedder.time_text_embed.text_embedder.linear_1.": "txt_in.c_embedder.linear_1.",
    "context_embedder.time_text_embed.text_embedder.linear_2.": "txt_in.c_embedder.linear_2.",
    "context_embedder.token_refiner.refiner_blocks.": "txt_in.individual_token_refiner.blocks.",
    "norm_out.linear.": "final_layer.adaLN_modulation.1.",
    "proj_out.": "final_layer.linear.",
}
_REFINER = {"attn.to_out.0": "self_attn_proj", "ff.net.0.proj": "mlp.fc1", "ff.net.2": "mlp.fc2",
            "norm_out.linear": "adaLN_modulation.1"}  # fmt: skip
_DOUBLE = {"norm1.linear": "img_mod.linear", "norm1_context.linear": "txt_mod.linear",
           "attn.norm_q": "img_attn_q_norm", "attn.norm_k": "img_attn_k_norm",
           "attn.norm_added_q": "txt_attn_q_norm", "attn.norm_added_k": "txt_attn_k_norm",
           "attn.to_out.0": "img_attn_proj", "attn.to_add_out": "txt_attn_proj", "ff.net.0.proj": "img_mlp.fc1",
           "ff.net.2": "img_mlp.fc2", "ff_context.net.0.proj": "txt_mlp.fc1", "ff_context.net.2": "txt_mlp.fc2"}  # fmt: skip
_SINGLE = {"norm.linear": "modulation.linear", "attn.norm_q": "q_norm", "attn.norm_k": "k_norm",
           "proj_out": "linear2"}  # fmt: skip


def tencent(sd: dict) -> dict:
    """A diffusers-named HunyuanVideo state dict in Tencent's release names: the inverse of diffusers'
    `convert_hunyuan_video_transformer_to_diffusers` (q, k, v fused into `*_attn_qkv`, a single block's
    q, k, v and MLP input into `linear1`, the final modulation's halves back in (shift, scale) order)."""

    def fused(prefix: str, names: tuple[str, ...], attr: str) -> torch.Tensor:
        return torch.cat([sd[f"{prefix}.{n}.{attr}"] for n in names])

    out = {}
    for k, v in sd.items():
        head, _, rest = k.partition(".")
        if head in ("transformer_blocks", "single_transformer_blocks") or ".refiner_blocks." in k:
            continue
        for a, b in _TOP.items():
            k = b + k[len(a) :] if k.startswith(a) else k
        if k == "final_layer.adaLN_modulation.1.weight" or k == "final_layer.adaLN_modulation.1.bias":
            scale, shift = v.chunk(2)
            v = torch.cat([shift, scale])
        out[k] = v
    keys = list(sd)
    for attr in ("weight", "bias"):
        for k in keys:
            if not k.endswith("." + attr):
                continue
            path = k[: -len(attr) - 1]
            parts = path.split(".")
            if path.startswith("context_embedder.token_refiner.refiner_blocks."):
                n, sub = parts[3], ".".join(parts[4:])
                base = f"txt_in.individual_token_refiner.blocks.{n}"
                if sub == "attn.to_q":
                    out[f"{base}.self_attn_qkv.{attr}"] = fused(
                        f"{'.'.join(parts[:4])}.attn", ("to_q", "to_k", "to_v"), attr
                    )
                elif sub in _REFINER:
                    out[f"{base}.{_REFINER[sub]}.{attr}"] = sd[k]
                elif sub in ("norm1", "norm2"):
                    out[f"{base}.{sub}.{attr}"] = sd[k]
            elif parts[0] == "transformer_blocks":
                n, sub, blk = parts[1], ".".join(parts[2:]), ".".join(parts[:2])
                if sub == "attn.to_q":
                    out[f"double_blocks.{n}.img_attn_qkv.{attr}"] = fused(
                        f"{blk}.attn", ("to_q", "to_k", "to_v"), attr
                    )
                elif sub == "attn.add_q_proj":
                    out[f"double_blocks.{n}.txt_attn_qkv.{attr}"] = fused(
                        f"{blk}.attn", ("add_q_proj", "add_k_proj", "add_v_proj"), attr)  # fmt: skip
                elif sub in _DOUBLE:
                    out[f"double_blocks.{n}.{_DOUBLE[sub]}.{attr}"] = sd[k]
            elif parts[0] == "single_transformer_blocks":
                n, sub, blk = parts[1], ".".join(parts[2:]), ".".join(parts[:2])
                if sub == "attn.to_q":
                    q, k_, v_ = (sd[f"{blk}.attn.{p}.{attr}"] for p in ("to_q", "to_k", "to_v"))
                    out[f"single_blocks.{n}.linear1.{attr}"] = torch.cat(
                        [q, k_, v_, sd[f"{blk}.proj_mlp.{attr}"]]
                    )
                elif sub in _SINGLE:
                    out[f"single_blocks.{n}.{_SINGLE[sub]}.{attr}"] = sd[k]
    return out


_COMFY = (("_mod.linear.", "_mod.lin."), ("_attn_qkv.", "_attn.qkv."), ("_attn_proj.", "_attn.proj."),
          ("_mlp.fc1.", "_mlp.0."), ("_mlp.fc2.", "_mlp.2."), ("_attn_q_norm.weight", "_attn.norm.query_norm.scale"),
          ("_attn_k_norm.weight", "_attn.norm.key_norm.scale"), ("modulation.linear.", "modulation.lin."),
          (".q_norm.weight", ".norm.query_norm.scale"), (".k_norm.weight", ".norm.key_norm.scale"),
          ("self_attn_qkv.", "self_attn.qkv."), ("self_attn_proj.", "self_attn.proj."), (".mlp.fc1.", ".mlp.0."),
          (".mlp.fc2.", ".mlp.2."), ("mlp.0.", "in_layer."), ("mlp.2.", "out_layer."),
          ("c_embedder.linear_1.", "c_embedder.in_layer."), ("c_embedder.linear_2.", "c_embedder.out_layer."))  # fmt: skip


def comfyui(tencent_sd: dict) -> dict:
    """Tencent's names in ComfyUI's FLUX-style ones (what `process_unet_state_dict` of its HunyuanVideo
    model makes of them, and what a checkpoint ComfyUI saves holds)."""
    out = {}
    for k, v in tencent_sd.items():
        for a, b in _COMFY:
            if a in ("mlp.0.", "mlp.2.") and not k.startswith(
                ("time_in.", "guidance_in.", "txt_in.t_embedder.")
            ):
                continue
            k = k.replace(a, b)
        out[k] = v
    return out


def diffusers_hunyuan15(seed: int = 10, meanflow: bool = False):
    """A reduced HunyuanVideo 1.5 (width 256: 2 heads of 128, 2 double blocks, 2 refiner blocks, 9 input and 4
    output channels, 64-wide text states, 48-wide byT5 states, 40-wide image states) in diffusers' class,
    well-scaled random weights: (model, its state dict)."""
    from diffusers import HunyuanVideo15Transformer3DModel

    model = HunyuanVideo15Transformer3DModel(
        in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=128, num_layers=2,
        text_embed_dim=64, text_embed_2_dim=48, image_embed_dim=40, use_meanflow=meanflow,
    )  # fmt: skip
    return well_scaled(model, seed)


_TOP15 = {
    "time_embed.timestep_embedder.linear_1.": "time_in.mlp.0.",
    "time_embed.timestep_embedder.linear_2.": "time_in.mlp.2.",
    "time_embed.timestep_embedder_r.linear_1.": "time_r_in.mlp.0.",
    "time_embed.timestep_embedder_r.linear_2.": "time_r_in.mlp.2.",
    "context_embedder_2.norm.": "byt5_in.layernorm.",
    "context_embedder_2.linear_1.": "byt5_in.fc1.",
    "context_embedder_2.linear_2.": "byt5_in.fc2.",
    "context_embedder_2.linear_3.": "byt5_in.fc3.",
    "image_embedder.norm_in.": "vision_in.proj.0.",
    "image_embedder.linear_1.": "vision_in.proj.1.",
    "image_embedder.linear_2.": "vision_in.proj.3.",
    "image_embedder.norm_out.": "vision_in.proj.4.",
    "cond_type_embed.": "cond_type_embedding.",
}


def tencent15(sd: dict) -> dict:
    """A diffusers-named HunyuanVideo 1.5 state dict in Tencent's names: 1.0's blocks and refiner as `tencent`
    renames them, and 1.5's own layers (`byt5_in`, `vision_in.proj`, `cond_type_embedding`, `time_r_in`)."""
    own = {}
    rest = {}
    for k, v in sd.items():
        for a, b in _TOP15.items():
            if k.startswith(a):
                own[b + k[len(a) :]] = v
                break
        else:
            rest[k] = v
    return {**tencent(rest), **own}


def diffusers_hunyuan_image(seed: int = 22, guidance: bool = False, meanflow: bool = False):
    """A reduced HunyuanImage 2.1 (width 256: 2 heads of 128, 1 double and 1 single block, 2 refiner blocks, 8 latent
    channels, 64-wide text and 48-wide byT5 states) in diffusers' class, well-scaled random weights: (model, state dict)."""
    from diffusers import HunyuanImageTransformer2DModel

    model = HunyuanImageTransformer2DModel(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=128, num_layers=1, num_single_layers=1,
        text_embed_dim=64, text_embed_2_dim=48, guidance_embeds=guidance, use_meanflow=meanflow,
    )  # fmt: skip
    return well_scaled(model, seed)


_IMAGE_OWN = {
    "time_guidance_embed.timestep_embedder.linear_1.": "time_in.mlp.0.",
    "time_guidance_embed.timestep_embedder.linear_2.": "time_in.mlp.2.",
    "time_guidance_embed.guidance_embedder.linear_1.": "guidance_in.mlp.0.",
    "time_guidance_embed.guidance_embedder.linear_2.": "guidance_in.mlp.2.",
    "time_guidance_embed.timestep_embedder_r.linear_1.": "time_r_in.mlp.0.",
    "time_guidance_embed.timestep_embedder_r.linear_2.": "time_r_in.mlp.2.",
    "context_embedder_2.norm.": "byt5_in.layernorm.",
    "context_embedder_2.linear_1.": "byt5_in.fc1.",
    "context_embedder_2.linear_2.": "byt5_in.fc2.",
    "context_embedder_2.linear_3.": "byt5_in.fc3.",
}


def tencent_image(sd: dict) -> dict:
    """A diffusers-named HunyuanImage 2.1 state dict in Tencent's names: 1.0's blocks and refiner as `tencent`
    renames them, its own time / guidance / MeanFlow embedders and `byt5_in`."""
    own, rest = {}, {}
    for k, v in sd.items():
        for a, b in _IMAGE_OWN.items():
            if k.startswith(a):
                own[b + k[len(a) :]] = v
                break
        else:
            rest[k] = v
    return {**tencent(rest), **own}


def diffusers_framepack(seed: int = 24):
    """A reduced FramePack (HunyuanVideo's reduced width and depth, with its history embedders and a 40-wide image
    projection) in diffusers' class, well-scaled random weights: (model, its state dict)."""
    from diffusers import HunyuanVideoFramepackTransformer3DModel

    model = HunyuanVideoFramepackTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=128, num_layers=1, num_single_layers=1,
        text_embed_dim=64, pooled_projection_dim=32, has_image_proj=True, image_proj_dim=40, has_clean_x_embedder=True,
    )  # fmt: skip
    return well_scaled(model, seed)
