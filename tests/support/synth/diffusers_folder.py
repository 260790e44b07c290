"""Diffusers pipeline folders (model_index.json + one folder per component), header-faithful and sparse.

What a `from_pretrained` folder holds (diffusers DiffusionPipeline.save_pretrained / the Hub repos of
each model): model_index.json naming the pipeline class and each component's (library, class);
per component a config.json (scheduler: scheduler_config.json) and the weights —
diffusion_pytorch_model.safetensors for diffusers models, model.safetensors for transformers models, or
numbered shards with a *.safetensors.index.json {"metadata": {"total_size"}, "weight_map"} when large.
Tokenizer folders (vocabularies) are not written: they hold no weights and no layout.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path

from . import flux as F
from . import mmdit as M
from . import text as T
from . import unet as U
from . import vae as V
from ._build import Builder, Entry

DIFFUSERS_VERSION = "0.30.0"


def unet_config(c: U.UNetConfig) -> dict:
    """UNet2DConditionModel config equivalent to an LDM config (the mapping of diffusers'
    create_unet_diffusers_config_from_ldm)."""
    attn = [
        2**i in c.attention_resolutions and c.transformer_depth[i] > 0 for i in range(len(c.channel_mult))
    ]
    cfg = {
        "_class_name": "UNet2DConditionModel",
        "in_channels": c.in_channels,
        "out_channels": c.out_channels,
        "block_out_channels": [c.model_channels * m for m in c.channel_mult],
        "down_block_types": ["CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attn],
        "up_block_types": ["CrossAttnUpBlock2D" if a else "UpBlock2D" for a in reversed(attn)],
        "layers_per_block": c.num_res_blocks,
        "cross_attention_dim": c.context_dim,
        "attention_head_dim": 8
        if not c.use_linear_in_transformer
        else [m * c.model_channels // 64 for m in c.channel_mult],
        "use_linear_projection": c.use_linear_in_transformer,
        "transformer_layers_per_block": list(c.transformer_depth),
        "sample_size": 128 if c.adm_in_channels else 64,
    }
    if c.adm_in_channels:
        cfg |= {
            "addition_embed_type": "text_time",
            "addition_time_embed_dim": 256,
            "projection_class_embeddings_input_dim": c.adm_in_channels,
        }
    return cfg


def vae_config(c: V.VAEConfig, scaling: float, shift: float | None = None) -> dict:
    n = len(c.ch_mult)
    cfg = {
        "_class_name": "AutoencoderKL",
        "in_channels": c.in_channels,
        "out_channels": c.out_ch,
        "down_block_types": ["DownEncoderBlock2D"] * n,
        "up_block_types": ["UpDecoderBlock2D"] * n,
        "block_out_channels": [c.ch * m for m in c.ch_mult],
        "layers_per_block": c.num_res_blocks,
        "latent_channels": c.z_channels,
        "use_quant_conv": c.quant_conv,
        "use_post_quant_conv": c.quant_conv,
        "scaling_factor": scaling,  # SD 0.18215, SDXL 0.13025, SD3 1.5305, FLUX.1 0.3611 (their vae configs)
    }
    if shift is not None:
        cfg["shift_factor"] = shift
    return cfg


def clip_config(c: T.ClipConfig, projection: bool, act: str) -> dict:
    return {
        "architectures": ["CLIPTextModelWithProjection" if projection else "CLIPTextModel"],
        "model_type": "clip_text_model",
        "vocab_size": c.vocab,
        "hidden_size": c.width,
        "intermediate_size": c.mlp,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.width // 64,
        "max_position_embeddings": c.positions,
        "projection_dim": c.projection,
        "hidden_act": act,  # quick_gelu for OpenAI CLIP-L, gelu for the LAION OpenCLIP towers
    }


def t5_config(c: T.T5Config) -> dict:
    return {
        "architectures": ["T5EncoderModel"],
        "model_type": "t5",
        "vocab_size": c.vocab,
        "d_model": c.d_model,
        "d_ff": c.d_ff,
        "d_kv": c.d_kv,
        "num_layers": c.layers,
        "num_heads": c.heads,
        "relative_attention_num_buckets": c.buckets,
        "feed_forward_proj": "gated-gelu",
        "is_encoder_decoder": False,
    }


def flux_config(c: F.FluxConfig) -> dict:
    return {
        "_class_name": "FluxTransformer2DModel",
        "in_channels": c.in_channels,
        "num_layers": c.depth,
        "num_single_layers": c.depth_single_blocks,
        "attention_head_dim": c.hidden_size // c.num_heads,
        "num_attention_heads": c.num_heads,
        "joint_attention_dim": c.context_in_dim,
        "pooled_projection_dim": c.vec_in_dim,
        "guidance_embeds": c.guidance_embed,
        "patch_size": 1,
    }


def sd3_config(c: M.MMDiTConfig) -> dict:
    return {
        "_class_name": "SD3Transformer2DModel",
        "sample_size": 128,
        "patch_size": c.patch,
        "in_channels": c.in_channels,
        "out_channels": c.in_channels,
        "num_layers": c.depth,
        "attention_head_dim": c.head_dim,
        "num_attention_heads": c.depth,
        "joint_attention_dim": c.context_dim,
        "caption_projection_dim": c.hidden,
        "pooled_projection_dim": c.pooled_dim,
        "pos_embed_max_size": c.pos_embed_max_size,
        "dual_attention_layers": list(c.dual_attention_layers),
        "qk_norm": "rms_norm" if c.qk_norm else None,
    }


# component -> (library, class, config, builder(Builder)) ; weights file stem by library
Component = tuple[str, str, dict, Callable[[Builder], None]]


def _clip(c: T.ClipConfig, proj: bool, act: str) -> Component:
    cls = "CLIPTextModelWithProjection" if proj else "CLIPTextModel"
    return ("transformers", cls, clip_config(c, proj, act), lambda b: T.clip_hf(b, c, projection=proj))


def _unet(c: U.UNetConfig) -> Component:
    return ("diffusers", "UNet2DConditionModel", unet_config(c), lambda b: U.unet_diffusers(b, c))


def _vae(c: V.VAEConfig, scaling: float, shift: float | None = None) -> Component:
    return ("diffusers", "AutoencoderKL", vae_config(c, scaling, shift), lambda b: V.vae_diffusers(b, c))


_T5 = ("transformers", "T5EncoderModel", t5_config(T.T5_XXL), lambda b: T.t5_encoder(b, T.T5_XXL))

# pipeline name -> (pipeline class, scheduler class, components); classes as in the Hub repos'
# model_index.json (stable-diffusion-v1-5, stable-diffusion-2-1, stable-diffusion-xl-base-1.0,
# FLUX.1-dev / -schnell, stable-diffusion-3-medium-diffusers).
PIPELINES: dict[str, tuple[str, str, dict[str, Component]]] = {
    "sd1": (
        "StableDiffusionPipeline",
        "PNDMScheduler",
        {
            "unet": _unet(U.SD1),
            "vae": _vae(V.SD, 0.18215),
            "text_encoder": _clip(T.CLIP_L, False, "quick_gelu"),
        },
    ),
    "sd2": (
        "StableDiffusionPipeline",
        "DDIMScheduler",
        {
            "unet": _unet(U.SD2),
            "vae": _vae(V.SD, 0.18215),
            "text_encoder": _clip(T.ClipConfig(1024, 23, 4096, projection=1024), False, "gelu"),
        },
    ),
    "sdxl": (
        "StableDiffusionXLPipeline",
        "EulerDiscreteScheduler",
        {
            "unet": _unet(U.SDXL),
            "vae": _vae(V.SD, 0.13025),
            "text_encoder": _clip(T.CLIP_L, False, "quick_gelu"),
            "text_encoder_2": _clip(T.CLIP_G, True, "gelu"),
        },
    ),
    "flux1_dev": (
        "FluxPipeline",
        "FlowMatchEulerDiscreteScheduler",
        {
            "transformer": (
                "diffusers",
                "FluxTransformer2DModel",
                flux_config(F.FLUX_DEV),
                lambda b: F.flux_diffusers(b, F.FLUX_DEV),
            ),
            "vae": _vae(V.FLUX1, 0.3611, 0.1159),
            "text_encoder": _clip(T.CLIP_L, False, "quick_gelu"),
            "text_encoder_2": _T5,
        },
    ),
    "flux1_schnell": (
        "FluxPipeline",
        "FlowMatchEulerDiscreteScheduler",
        {
            "transformer": (
                "diffusers",
                "FluxTransformer2DModel",
                flux_config(F.FLUX_SCHNELL),
                lambda b: F.flux_diffusers(b, F.FLUX_SCHNELL),
            ),
            "vae": _vae(V.FLUX1, 0.3611, 0.1159),
            "text_encoder": _clip(T.CLIP_L, False, "quick_gelu"),
            "text_encoder_2": _T5,
        },
    ),
    "sd3_medium": (
        "StableDiffusion3Pipeline",
        "FlowMatchEulerDiscreteScheduler",
        {
            "transformer": (
                "diffusers",
                "SD3Transformer2DModel",
                sd3_config(M.SD3_MEDIUM),
                lambda b: M.mmdit_diffusers(b, M.SD3_MEDIUM),
            ),
            "vae": _vae(V.SD3, 1.5305, 0.0609),
            "text_encoder": _clip(T.CLIP_L, True, "quick_gelu"),
            "text_encoder_2": _clip(T.CLIP_G, True, "gelu"),
            "text_encoder_3": _T5,
        },
    ),
}


def _write_weights(folder: Path, stem: str, rows: list[Entry], shard_bytes: int) -> list[Path]:
    from engine.formats.atomic import atomic_output
    from engine.formats.dtypes import nbytes_for
    from engine.formats.safetensors import write_sparse

    sizes = [nbytes_for(d, math.prod(s)) or 0 for _, d, s in rows]
    total = sum(sizes)
    if total <= shard_bytes:
        return [write_sparse(folder / f"{stem}.safetensors", rows)]
    shards: list[list[Entry]] = [[]]
    acc = 0
    for row, n in zip(rows, sizes, strict=True):
        if acc + n > shard_bytes and shards[-1]:
            shards.append([])
            acc = 0
        shards[-1].append(row)
        acc += n
    paths, weight_map = [], {}
    for i, shard in enumerate(shards, 1):
        name = f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors"
        paths.append(write_sparse(folder / name, shard))
        weight_map |= {k: name for k, _, _ in shard}
    with atomic_output(folder / f"{stem}.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return paths


def write_diffusers(
    name: str, directory: str | os.PathLike, *, dtype: str = "F16", shard_bytes: int = 10 * 1024**3
) -> Path:
    """Write pipeline `name` (see PIPELINES) as a diffusers folder with sparse weight files."""
    from engine.formats.atomic import atomic_output

    pipe_cls, sched_cls, comps = PIPELINES[name]
    root = Path(directory)
    index: dict = {
        "_class_name": pipe_cls,
        "_diffusers_version": DIFFUSERS_VERSION,
        "scheduler": ["diffusers", sched_cls],
    }
    for comp, (lib, cls, config, build) in comps.items():
        folder = root / comp
        folder.mkdir(parents=True, exist_ok=True)
        b = Builder(dtype)
        build(b)
        _write_weights(
            folder, "diffusion_pytorch_model" if lib == "diffusers" else "model", b.rows, shard_bytes
        )
        cfg = dict(config)
        if lib == "diffusers":
            cfg["_diffusers_version"] = DIFFUSERS_VERSION
        else:
            cfg["torch_dtype"] = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}.get(
                dtype, "float16"
            )
        with atomic_output(folder / "config.json", "w") as f:
            json.dump(cfg, f, indent=2)
        index[comp] = [lib, cls]
        if comp.startswith("text_encoder"):
            tok = "tokenizer" + comp[len("text_encoder") :]
            index[tok] = ["transformers", "T5TokenizerFast" if cls == "T5EncoderModel" else "CLIPTokenizer"]
    (root / "scheduler").mkdir(parents=True, exist_ok=True)
    with atomic_output(root / "scheduler" / "scheduler_config.json", "w") as f:
        json.dump({"_class_name": sched_cls, "_diffusers_version": DIFFUSERS_VERSION}, f, indent=2)
    with atomic_output(root / "model_index.json", "w") as f:
        json.dump(index, f, indent=2)
    return root
