"""Reduced-depth denoisers for the forward-pass tests.

Random weights in the original key layout (the project's synth layouts, built from the original
configs with fewer channels and blocks), written as .safetensors; and the same weights loaded into
diffusers' own model classes — the independent reference: diffusers' converter for the UNet
(`convert_ldm_unet_checkpoint`), and for FLUX.1 a small BFL -> diffusers renaming written here from
the facts of diffusers' `convert_flux_transformer_checkpoint_to_diffusers` (whose single-block split
assumes the full 3072 width). Both are loaded with strict=True: every key and shape must match.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

try:  # the fixture generators move to tests/support/synth
    from tests.support.synth import flux as _flux
    from tests.support.synth import unet as _unet
    from tests.support.synth._build import Builder
except ImportError:  # pragma: no cover - before that move
    from engine.synth import flux as _flux
    from engine.synth import unet as _unet
    from engine.synth._build import Builder

from engine.formats.safetensors import save_tensors

PREFIX = "model.diffusion_model."

# The original configs (engine synth's SD1 / SD2 / SDXL: CompVis v1-inference.yaml, v2-inference-v.yaml,
# sd_xl_base.yaml) with fewer channels and transformer blocks; the context and ADM widths stay, so
# detection sees the family it is.
SD1 = _unet.SD1
SD1_TINY = _unet.SD1.with_(model_channels=32, channel_mult=(1, 2, 2), attention_resolutions=(1, 2))
SD1_INPAINT_TINY = SD1_TINY.with_(in_channels=9)
SD2_TINY = _unet.SD2.with_(model_channels=64, channel_mult=(1, 2, 2), attention_resolutions=(1, 2))
SDXL_TINY = _unet.SDXL.with_(model_channels=64, transformer_depth=(0, 1, 2), transformer_depth_middle=2)
FLUX_DEV_TINY = _flux.FLUX_DEV.with_(hidden_size=256, num_heads=2, depth=2, depth_single_blocks=2)
FLUX_SCHNELL_TINY = FLUX_DEV_TINY.with_(guidance_embed=False)


def unet_rows(cfg, prefix: str = PREFIX, dtype: str = "F32"):
    b = Builder(dtype, prefix)
    _unet.unet_ldm(b, cfg)
    return b.rows


def flux_rows(cfg, prefix: str = "", dtype: str = "F32"):
    b = Builder(dtype, prefix)
    _flux.flux_bfl(b, cfg)
    return b.rows


def random_weights(rows, seed: int = 0) -> dict[str, torch.Tensor]:
    """Well-scaled random tensors: matrices ~ N(0, 1/fan_in), norm weights ~ 1 + N(0, 0.1²), biases ~
    N(0, 0.1²) — activations stay O(1) through the depth, so comparisons test the maths, not overflow."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, dtype, shape in rows:
        if len(shape) >= 2:
            t = torch.randn(shape, generator=g) / math.sqrt(math.prod(shape[1:]))
        elif key.endswith((".weight", ".scale")):
            t = 1 + 0.1 * torch.randn(shape, generator=g)
        else:
            t = 0.1 * torch.randn(shape, generator=g)
        out[key] = t.to({"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[dtype])
    return out


def write(path: Path, tensors: dict) -> Path:
    save_tensors(path, tensors)
    return Path(path)


# -- diffusers references --------------------------------------------------------------------------------


def diffusers_unet_config(cfg, architecture: str) -> dict:
    levels = len(cfg.channel_mult)
    attn = [2**i in cfg.attention_resolutions and cfg.transformer_depth[i] > 0 for i in range(levels)]
    chans = [cfg.model_channels * m for m in cfg.channel_mult]
    config = dict(
        sample_size=8,
        in_channels=cfg.in_channels,
        out_channels=cfg.out_channels,
        layers_per_block=cfg.num_res_blocks,
        block_out_channels=tuple(chans),
        down_block_types=tuple("CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attn),
        up_block_types=tuple("CrossAttnUpBlock2D" if a else "UpBlock2D" for a in reversed(attn)),
        cross_attention_dim=cfg.context_dim,
        # diffusers' `attention_head_dim` holds the head *count* of these configs (its old naming)
        attention_head_dim=8 if architecture == "sd1" else tuple(max(1, c // 64) for c in chans),
        use_linear_projection=cfg.use_linear_in_transformer,
        transformer_layers_per_block=tuple(max(1, cfg.transformer_depth[i]) for i in range(levels)),
    )
    if cfg.adm_in_channels:
        config.update(
            addition_embed_type="text_time",
            addition_time_embed_dim=256,
            projection_class_embeddings_input_dim=cfg.adm_in_channels,
        )
    return config


def diffusers_unet(cfg, architecture: str, ldm: dict):
    """diffusers' UNet2DConditionModel holding `ldm` (original keys with the model.diffusion_model.
    prefix), converted by diffusers' own single-file converter; also returns the converted state dict."""
    from diffusers import UNet2DConditionModel
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    config = diffusers_unet_config(cfg, architecture)
    sd = convert_ldm_unet_checkpoint(dict(ldm), config)
    model = UNet2DConditionModel(**config)
    model.load_state_dict(sd, strict=True)
    return model.eval(), sd


def flux_to_diffusers(sd: dict, hidden: int) -> dict:
    """BFL FLUX.1 keys -> diffusers FluxTransformer2DModel keys (the facts of diffusers' converter)."""
    out: dict[str, torch.Tensor] = {}

    def put(new: str, old: str) -> None:
        for s in ("weight", "bias"):
            if f"{old}.{s}" in sd:
                out[f"{new}.{s}"] = sd[f"{old}.{s}"]

    def rows(new: tuple[str, ...], old: str, sizes: tuple[int, ...]) -> None:
        for s in ("weight", "bias"):
            for n, part in zip(new, sd[f"{old}.{s}"].split(sizes, dim=0), strict=True):
                out[f"{n}.{s}"] = part.clone()

    te = "time_text_embed"
    for new, old in (("x_embedder", "img_in"), ("context_embedder", "txt_in"), ("proj_out", "final_layer.linear"),
                     (f"{te}.timestep_embedder.linear_1", "time_in.in_layer"),
                     (f"{te}.timestep_embedder.linear_2", "time_in.out_layer"),
                     (f"{te}.text_embedder.linear_1", "vector_in.in_layer"),
                     (f"{te}.text_embedder.linear_2", "vector_in.out_layer"),
                     (f"{te}.guidance_embedder.linear_1", "guidance_in.in_layer"),
                     (f"{te}.guidance_embedder.linear_2", "guidance_in.out_layer")):  # fmt: skip
        put(new, old)
    for s in ("weight", "bias"):  # diffusers' AdaLayerNormContinuous is (scale, shift)
        if f"final_layer.adaLN_modulation.1.{s}" in sd:  # (Chroma has none)
            shift, scale = sd[f"final_layer.adaLN_modulation.1.{s}"].chunk(2, dim=0)
            out[f"norm_out.linear.{s}"] = torch.cat([scale, shift])
    # Chroma's distilled_guidance_layer (convert_chroma_transformer_checkpoint_to_diffusers)
    g = "distilled_guidance_layer"
    put(f"{g}.in_proj", f"{g}.in_proj")
    put(f"{g}.out_proj", f"{g}.out_proj")
    for i in sorted({int(k.split(".")[2]) for k in sd if k.startswith(f"{g}.layers.")}):
        put(f"{g}.layers.{i}.linear_1", f"{g}.layers.{i}.in_layer")
        put(f"{g}.layers.{i}.linear_2", f"{g}.layers.{i}.out_layer")
        out[f"{g}.norms.{i}.weight"] = sd[f"{g}.norms.{i}.scale"]
    doubles = sorted({int(k.split(".")[1]) for k in sd if k.startswith("double_blocks.")})
    for i in doubles:
        d, b = f"transformer_blocks.{i}", f"double_blocks.{i}"
        put(f"{d}.norm1.linear", f"{b}.img_mod.lin")
        put(f"{d}.norm1_context.linear", f"{b}.txt_mod.lin")
        rows((f"{d}.attn.to_q", f"{d}.attn.to_k", f"{d}.attn.to_v"), f"{b}.img_attn.qkv", (hidden,) * 3)
        rows((f"{d}.attn.add_q_proj", f"{d}.attn.add_k_proj", f"{d}.attn.add_v_proj"), f"{b}.txt_attn.qkv",
             (hidden,) * 3)  # fmt: skip
        for n, o in (("norm_q", "img_attn.norm.query_norm"), ("norm_k", "img_attn.norm.key_norm"),
                     ("norm_added_q", "txt_attn.norm.query_norm"), ("norm_added_k", "txt_attn.norm.key_norm")):  # fmt: skip
            out[f"{d}.attn.{n}.weight"] = sd[f"{b}.{o}.scale"]
        put(f"{d}.attn.to_out.0", f"{b}.img_attn.proj")
        put(f"{d}.attn.to_add_out", f"{b}.txt_attn.proj")
        put(f"{d}.ff.net.0.proj", f"{b}.img_mlp.0")
        put(f"{d}.ff.net.2", f"{b}.img_mlp.2")
        put(f"{d}.ff_context.net.0.proj", f"{b}.txt_mlp.0")
        put(f"{d}.ff_context.net.2", f"{b}.txt_mlp.2")
    singles = sorted({int(k.split(".")[1]) for k in sd if k.startswith("single_blocks.")})
    for i in singles:
        d, b = f"single_transformer_blocks.{i}", f"single_blocks.{i}"
        mlp = sd[f"{b}.linear1.weight"].shape[0] - 3 * hidden
        rows((f"{d}.attn.to_q", f"{d}.attn.to_k", f"{d}.attn.to_v", f"{d}.proj_mlp"), f"{b}.linear1",
             (hidden, hidden, hidden, mlp))  # fmt: skip
        put(f"{d}.proj_out", f"{b}.linear2")
        put(f"{d}.norm.linear", f"{b}.modulation.lin")
        out[f"{d}.attn.norm_q.weight"] = sd[f"{b}.norm.query_norm.scale"]
        out[f"{d}.attn.norm_k.weight"] = sd[f"{b}.norm.key_norm.scale"]
    return out


def diffusers_flux(cfg, bfl: dict):
    from diffusers import FluxTransformer2DModel

    sd = flux_to_diffusers(bfl, cfg.hidden_size)
    model = FluxTransformer2DModel(
        patch_size=1, in_channels=cfg.in_channels, num_layers=cfg.depth, num_single_layers=cfg.depth_single_blocks,
        attention_head_dim=cfg.hidden_size // cfg.num_heads, num_attention_heads=cfg.num_heads,
        joint_attention_dim=cfg.context_in_dim, pooled_projection_dim=cfg.vec_in_dim,
        guidance_embeds=cfg.guidance_embed, axes_dims_rope=(16, 56, 56),
    )  # fmt: skip
    model.load_state_dict(sd, strict=True)
    return model.eval(), sd


def diffusers_qwen_image(seed: int = 4):
    """A reduced Qwen-Image (2 layers of 2 heads, 96-wide text) in diffusers' class, well-scaled random
    weights (Qwen-Image has one naming: its state dict is the file's): (model, state dict)."""
    from diffusers import QwenImageTransformer2DModel

    return well_scaled(
        QwenImageTransformer2DModel(num_layers=2, num_attention_heads=2, joint_attention_dim=96), seed
    )


def well_scaled(model, seed: int):
    """(model, its state dict) with well-scaled random weights loaded: matrices ~ N(0, 1/fan_in), norm
    scales ~ 1 + N(0, 0.1²), other vectors ~ N(0, 0.1²), learned pad tokens ~ N(0, 1) (diffusers makes
    them zeros, which would hide a pad row in the wrong place)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for k, p in model.state_dict().items():
        r = torch.randn(p.shape, generator=g)
        if k.endswith("pad_token"):
            sd[k] = r
        elif p.dim() == 2:
            sd[k] = r / math.sqrt(p.shape[1])
        else:
            sd[k] = 1 + 0.1 * r if "norm" in k else 0.1 * r
    model.load_state_dict(sd, strict=True)
    return model.eval(), sd


def diffusers_z_image(seed: int = 3):
    """A reduced Z-Image (width 256: 2 heads of 128, 2 layers, 2 + 2 refiners, 64-wide captions) in
    diffusers' class, well-scaled random weights (pad tokens too: diffusers makes them zeros): (model, its
    state dict in diffusers' naming)."""
    from diffusers import ZImageTransformer2DModel

    return well_scaled(
        ZImageTransformer2DModel(dim=256, n_layers=2, n_heads=2, n_kv_heads=2, cap_feat_dim=64), seed
    )


def z_image_original(sd: dict) -> dict:
    """A diffusers-named Z-Image state dict in the release's naming (ComfyUI's files): q, k and v fused
    into `attention.qkv`, `attention.out`, `q_norm` / `k_norm`, `x_embedder`, `final_layer` -- the inverse
    of diffusers' `convert_z_image_transformer_checkpoint_to_diffusers`."""
    names = (("all_x_embedder.2-1.", "x_embedder."), ("all_final_layer.2-1.", "final_layer."),
             (".attention.to_out.0.", ".attention.out."), (".attention.norm_q.", ".attention.q_norm."),
             (".attention.norm_k.", ".attention.k_norm."))  # fmt: skip
    out = {}
    for k, v in sd.items():
        if ".attention.to_k." in k or ".attention.to_v." in k:
            continue
        if ".attention.to_q." in k:
            qkv = [sd[k.replace(".to_q.", f".to_{n}.")] for n in "qkv"]
            out[k.replace(".to_q.", ".qkv.")] = torch.cat(qkv)
            continue
        for a, b in names:
            k = k.replace(a, b)
        out[k] = v
    return out


def diffusers_auraflow(seed: int = 6):
    """A reduced AuraFlow (width 512: 2 heads of 256, 2 double and 2 single blocks, 64-wide text states, a
    16 x 16 position grid) in diffusers' class, well-scaled random weights: (model, its state dict)."""
    from diffusers import AuraFlowTransformer2DModel

    model = AuraFlowTransformer2DModel(
        sample_size=32, num_mmdit_layers=2, num_single_dit_layers=2, attention_head_dim=256, num_attention_heads=2,
        joint_attention_dim=64, caption_projection_dim=512, pos_embed_max_size=256,
    )  # fmt: skip
    return well_scaled(model, seed)


def auraflow_release(sd: dict) -> dict:
    """A diffusers-named AuraFlow state dict in the release's naming (ComfyUI's files, Pony V7's): the inverse
    of diffusers' `convert_auraflow_transformer_checkpoint_to_diffusers` (the final modulation's halves back
    in (shift, scale) order)."""
    top = {
        "pos_embed.pos_embed": "positional_encoding",
        "pos_embed.proj.": "init_x_linear.",
        "time_step_proj.linear_1.": "t_embedder.mlp.0.",
        "time_step_proj.linear_2.": "t_embedder.mlp.2.",
        "context_embedder.": "cond_seq_linear.",
        "proj_out.": "final_linear.",
        "norm_out.linear.": "modF.1.",
    }
    double = {
        "norm1.linear": "modX.1",
        "norm1_context.linear": "modC.1",
        "attn.to_q": "attn.w2q",
        "attn.to_k": "attn.w2k",
        "attn.to_v": "attn.w2v",
        "attn.to_out.0": "attn.w2o",
        "attn.add_q_proj": "attn.w1q",
        "attn.add_k_proj": "attn.w1k",
        "attn.add_v_proj": "attn.w1v",
        "attn.to_add_out": "attn.w1o",
        "ff_context.": "mlpC.",
        "ff.": "mlpX.",
    }
    single = {
        "norm1.linear": "modCX.1",
        "attn.to_q": "attn.w1q",
        "attn.to_k": "attn.w1k",
        "attn.to_v": "attn.w1v",
        "attn.to_out.0": "attn.w1o",
        "ff.": "mlp.",
    }
    mlp = {"linear_1": "c_fc1", "linear_2": "c_fc2", "out_projection": "c_proj"}  # fmt: skip
    out = {}
    for k, v in sd.items():
        for a, b in top.items():
            k = k.replace(a, b) if k.startswith(a) else k
        for head, names, new in (("joint_transformer_blocks.", double, "double_layers."),
                                 ("single_transformer_blocks.", single, "single_layers.")):  # fmt: skip
            if k.startswith(head):
                k = new + k[len(head) :]
                for a, b in names.items():
                    k = k.replace(f".{a}", f".{b}", 1) if f".{a}" in k else k
                for a, b in mlp.items():
                    k = k.replace(f".{a}.", f".{b}.")
        if k == "modF.1.weight":
            scale, shift = v.chunk(2)
            v = torch.cat([shift, scale])
        out[k] = v
    return out


def diffusers_lumina2(seed: int = 5):
    """A reduced Lumina 2 (width 192: 2 query heads of 96 on 1 K/V head, 2 layers, 2 + 2 refiners, 64-wide
    captions) in diffusers' class, well-scaled random weights: (model, its state dict in diffusers' naming)."""
    from diffusers import Lumina2Transformer2DModel

    model = Lumina2Transformer2DModel(hidden_size=192, num_layers=2, num_attention_heads=2, num_kv_heads=1,
                                      cap_feat_dim=64)  # fmt: skip
    return well_scaled(model, seed)


def lumina2_original(sd: dict) -> dict:
    """A diffusers-named Lumina 2 state dict in Lumina-Image-2.0's release naming (ComfyUI's files): q, k and
    v fused into `attention.qkv`, `feed_forward.w1/2/3`, `adaLN_modulation.1`, `final_layer`, and the
    release's unused `norm_final` -- the inverse of diffusers' `convert_lumina2_to_diffusers`."""
    names = (("time_caption_embed.caption_embedder.", "cap_embedder."),
             ("time_caption_embed.timestep_embedder.linear_1.", "t_embedder.mlp.0."),
             ("time_caption_embed.timestep_embedder.linear_2.", "t_embedder.mlp.2."),
             ("norm_out.linear_1.", "final_layer.adaLN_modulation.1."), ("norm_out.linear_2.", "final_layer.linear."),
             (".attn.to_out.0.", ".attention.out."), (".attn.norm_q.", ".attention.q_norm."),
             (".attn.norm_k.", ".attention.k_norm."), (".feed_forward.linear_1.", ".feed_forward.w1."),
             (".feed_forward.linear_2.", ".feed_forward.w2."), (".feed_forward.linear_3.", ".feed_forward.w3."),
             (".norm1.linear.", ".adaLN_modulation.1."), (".norm1.norm.", ".attention_norm1."),
             (".norm1.", ".attention_norm1."), (".norm2.", ".attention_norm2."))  # fmt: skip
    out = {}
    for k, v in sd.items():
        if ".attn.to_k." in k or ".attn.to_v." in k:
            continue
        if ".attn.to_q." in k:
            out[k.replace(".attn.to_q.", ".attention.qkv.")] = torch.cat(
                [sd[k.replace(".to_q.", f".to_{n}.")] for n in "qkv"]
            )
            continue
        for a, b in names:
            k = k.replace(a, b)
        out[k] = v
    out["norm_final.weight"] = torch.ones(sd["x_embedder.weight"].shape[0])  # in the release, never read
    return out


def run_diffusers_lumina2(model, inputs: dict) -> torch.Tensor:
    """diffusers' Lumina 2 on our inputs (its caption mask all ones when none is given)."""
    x, caps = inputs["x"], inputs["cap_feats"]
    mask = inputs.get("cap_mask", torch.ones(caps.shape[:2]))
    return model(x, inputs["t"], caps, mask.bool(), return_dict=False)[0]


def run_diffusers_z_image(model, inputs: dict) -> torch.Tensor:
    """diffusers' Z-Image on our batched inputs (its forward takes lists of [C, F, H, W] frames)."""
    frames = [x.unsqueeze(1) for x in inputs["x"]]
    out = model(frames, inputs["t"], list(inputs["cap_feats"]), return_dict=False)[0]
    return torch.stack([o.squeeze(1) for o in out])


def run_diffusers_unet(model, inputs: dict, size: tuple[int, int] | None = None) -> torch.Tensor:
    """diffusers' UNet on Loadout's input names; SDXL's `y` is split back into the pooled embedding and
    the six size numbers diffusers embeds itself (so the ADM layout is checked, not assumed)."""
    kw = {}
    if "y" in inputs:
        w, h = size
        kw["added_cond_kwargs"] = {
            "text_embeds": inputs["y"][:, :1280],
            "time_ids": torch.tensor([[h, w, 0, 0, h, w]], dtype=torch.float32).repeat(
                inputs["y"].shape[0], 1
            ),
        }
    with torch.inference_mode():
        return model(inputs["x"], inputs["timesteps"], inputs["context"], **kw).sample


def run_diffusers_flux(model, inputs: dict) -> torch.Tensor:
    with torch.inference_mode():
        return model(
            hidden_states=inputs["img"], encoder_hidden_states=inputs["txt"], pooled_projections=inputs["y"],
            timestep=inputs["timesteps"], img_ids=inputs["img_ids"][0], txt_ids=inputs["txt_ids"][0],
            guidance=inputs.get("guidance"),
        ).sample  # fmt: skip


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


@dataclass
class Tiny:
    """One reduced model: its config, architecture, and files in both namings."""

    cfg: object
    architecture: str
    ldm: Path  # original naming (UNet with the model.diffusion_model. prefix; FLUX in BFL naming)
    diffusers: Path
    weights: dict


# -- what every family's tests check the same way ----------------------------------------------------------


def recorded_order(den, component, inputs) -> list:
    """The ops a forward fetches its weights from, in call order (what the streamer reads ahead in)."""
    seen = []

    def record(op):
        seen.append(op)
        return {a: getattr(op, a) for a in (op.weight_attr, "bias") if getattr(op, a, None) is not None}

    for u in component.units:
        u.module.fetch = record
    try:
        with torch.inference_mode():
            den(inputs)
    finally:
        for u in component.units:
            u.module.__dict__.pop("fetch", None)
    return seen


def check_op_order(path, architecture: str, prefix: str = "", plain: int = 0) -> None:
    """The ops a forward fetches, in call order, are its op_order(); every unit of the component is one of
    them but `plain` holders of tensors the forward reads directly (a norm's scale, pad tokens)."""
    from engine import denoise
    from engine.model import Component

    c = Component("transformer", path, prefix)
    den = denoise.bind(c, architecture)
    seen = recorded_order(den, c, den.random_inputs(64, 64))
    assert [id(o) for o in seen] == [id(o) for o in den.op_order()]
    assert len(seen) == len(c.units) - plain


def check_steps_alike(path, tmp_path, budget_gb: float, architecture: str, output_shape: tuple) -> None:
    """A 64×64 step fully resident and one under `budget_gb` (the rest streamed) give the same bits."""
    runs = step_full_and_partial(path, tmp_path, budget_gb, size=(64, 64), steps=1)
    (full, a), (partial, b) = runs["full"], runs["partial"]
    assert (full.architecture, full.output_shape) == (architecture, output_shape)
    assert partial.streamed_bytes_per_step > 0
    assert torch.equal(a, b)


def check_gguf_like_its_twin(
    tmp_path,
    weights: dict,
    arch: str,
    pick,
    architecture: str,
    size=(64, 64),
    ggml_dims: bool = False,
    tol: float = 1e-6,
) -> list:
    """Write `weights` as a GGUF (general.architecture `arch`; the tensors `pick(key, tensor)` chooses in
    Q8_0, the rest as they are; `ggml_dims`: leading axes of 1 dropped, as ggml's writer stores shapes)
    and its dequantized safetensors twin; the forward on each gives the same output (`tol`). Returns the
    quantized keys."""
    from engine import denoise
    from engine.model import Component
    from tests.support.gguf_files import write_gguf_twin

    twin, quantized = write_gguf_twin(tmp_path / "model.gguf", weights, arch, pick, ggml_dims=ggml_dims)
    twin_path = write(tmp_path / "twin.safetensors", twin)
    dens = [
        denoise.bind(Component("transformer", str(p), "", compute_dtype="float32"), architecture)
        for p in (tmp_path / "model.gguf", twin_path)
    ]
    inputs = dens[0].random_inputs(*size, seed=3)
    with torch.inference_mode():
        out, want = (d(inputs) for d in dens)
    assert rel_l2(out, want) <= tol
    return quantized


def step_full_and_partial(path, tmp_path, budget_gb: float, **step) -> dict:
    """{"full": (result, out), "partial": (result, out)}: one Step fully resident and one under a budget
    of `budget_gb` (the rest streamed), each in its own Engine on the CPU."""
    from engine.devices import DeviceOptions
    from engine.facade import Engine
    from engine.formats.safetensors import SafetensorsFile
    from engine.requests import Step

    runs = {}
    for name, budget in (("full", None), ("partial", budget_gb)):
        e = Engine()
        e.detect(DeviceOptions(cpu=True, vram_budget_gb=budget))
        try:
            r = e.run(Step(str(path), out=str(tmp_path / f"{name}.safetensors"), **step))
        finally:
            e.close()
        assert r.mode == name
        runs[name] = (r, SafetensorsFile(tmp_path / f"{name}.safetensors").tensor("out").clone())
    return runs


def lora_and_merged(sd: dict, keys: dict, strength: float, seed: int, rank: int = 4, kohya: bool = False):
    """(a LoRA over the modules `keys` names, `sd` with each one's ΔW merged by hand): `keys` maps a module path of
    `sd` (diffusers' model) to the LoRA's name for it; PEFT tensors (lora_A / lora_B), or kohya's (lora_down / lora_up
    with alpha = rank, so the scale is 1). Down ~ N(0, 1/fan-in), up small; a conv's down has its kernel, its up 1×1."""
    g = torch.Generator().manual_seed(seed)
    lora, merged = {}, dict(sd)
    for d, k in keys.items():
        w = sd[f"{d}.weight"]
        a = torch.randn(rank, *w.shape[1:], generator=g) / w[0].numel() ** 0.5
        b = torch.randn(w.shape[0], rank, *[1] * (w.ndim - 2), generator=g) * 0.1
        if kohya:
            lora |= {
                f"{k}.lora_down.weight": a,
                f"{k}.lora_up.weight": b,
                f"{k}.alpha": torch.tensor(float(rank)),
            }
        else:
            lora |= {f"{k}.lora_A.weight": a, f"{k}.lora_B.weight": b}
        merged[f"{d}.weight"] = w + strength * (b.flatten(1) @ a.flatten(1)).reshape(w.shape)
    return lora, merged


def plain_and_merged(ref, sd: dict, merged: dict, run) -> tuple:
    """(run() on diffusers' model `ref` as it is, run() with the `merged` weights loaded); `sd` loaded back after."""
    with torch.inference_mode():
        plain = run()
        ref.load_state_dict(merged)
        try:
            return plain, run()
        finally:
            ref.load_state_dict(sd)


def check_lora_step(model, lora: dict, strength: float, inputs: dict, tmp_path, budget_gb: float | None, want,
                    modules: int, what: str, base: str | None = None, tol: float = 1e-4) -> None:  # fmt: skip
    """A step of `model` with `lora` (lora_step) places all `modules` of it, equals `want` (diffusers' model with the
    LoRA merged by hand) within `tol`, and, given `base`, the LoRA file reads as made for that family."""
    r, out = lora_step(model, lora, strength, inputs, tmp_path, budget_gb)
    assert r.loras and r.loras[0]["mapped"] == modules, r.loras
    if base is not None:
        from engine.detect import detect_file

        assert detect_file(str(tmp_path / "lora.safetensors")).lora.base == base  # its keys say so
    err = rel_l2(out, want)
    print(f"{what}: relative L2 {err:.2e}")
    assert err <= tol


def lora_step(model, lora: dict, strength: float, inputs: dict, tmp_path, budget_gb: float | None = None):
    """One Step of `model` on `inputs` with the LoRA `lora` (tensors, written beside them) at `strength`, in its own
    Engine on the CPU, fully resident (None) or under `budget_gb`: (the result, its output)."""
    from engine.devices import DeviceOptions
    from engine.facade import Engine
    from engine.formats.safetensors import SafetensorsFile
    from engine.requests import StackItem, Step

    write(tmp_path / "in.safetensors", inputs)
    lora_path = write(tmp_path / "lora.safetensors", lora)
    out = tmp_path / f"out_{budget_gb}.safetensors"
    e = Engine()
    e.detect(DeviceOptions(cpu=True, vram_budget_gb=budget_gb))
    try:
        r = e.run(Step(str(model), loras=(StackItem(str(lora_path), strength),), inputs=str(tmp_path / "in.safetensors"),
                       out=str(out)))  # fmt: skip
    finally:
        e.close()
    assert r.mode == ("full" if budget_gb is None else "partial")
    return r, SafetensorsFile(out).tensor("out")
