"""Denoisers' forward passes over loaded components: the UNet of SD1 / SD2 / SDXL, FLUX.1's,
FLUX.2's, FLUX.3's and Chroma's transformers, SD3 / SD3.5's MMDiT, Qwen-Image's (1 and 2.1), Z-Image's, Lumina 2's, AuraFlow's, Wan
2.x's, HunyuanVideo 1.0's and 1.5's, HunyuanImage 2.1's, LTX-Video's, LTX-2's, Cosmos Predict2's and 1.0's, Mochi 1's, Krea 2's, Sana's, SANA-Video's, PixArt's, Hunyuan-DiT's, HiDream-I1's,
ERNIE-Image's, Bria 3.2's and FIBO's, LongCat-Image's, Ovis-Image's, GLM-Image's, Ideogram 4's, PRX's, JoyImage's,
Kandinsky 5's, 6's and 6 SR's, Bria FIBO 2's, NucleusMoE-Image's, Motif-Video's, MiniMax-H3's and Stable Cascade's Stage C and B UNets, run on the component's own castable ops (the
residency manager's modules, tiers and patches), in the file's own key layout — original or diffusers naming
(SELF_DESCRIBED lists the families whose module says all about itself).

    den = bind(component, "sdxl")          # engine.denoise.Denoiser
    out = den(inputs)                      # inputs: names as the original codebases call them

Written from the published architectures (see unet.py and flux.py for the facts and their sources).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

from ..errors import FormatError, UnsupportedModel
from .common import Ops, Taken, unused_layers
from .inputs import check_inputs, names
from .random_inputs import random_inputs

UNETS = ("sd1", "sd2", "sdxl", "sdxl_refiner")
FLUX = ("flux1_dev", "flux1_schnell")
WAN = ("wan21", "wan22")  # T2V, I2V, FLF2V, VACE and Animate transformers (engine.denoise.wan, wan_animate)
FLUX2 = ("flux2",)  # [dev] and [klein] (engine.denoise.flux2)
FLUX3 = ("flux3",)  # FLUX.3, base and step-distilled (engine.denoise.flux3)
CHROMA = ("chroma",)  # FLUX.1's blocks under one distilled modulation network (engine.denoise.flux)
# SD3 / SD3.5 (engine.denoise.mmdit); `mmdit`: an MMDiT of no known release size (read from its shapes)
MMDIT = ("sd3", "sd3.5_medium", "sd3.5_large", "mmdit")
QWEN = ("qwen_image",)  # engine.denoise.qwen_image
QWEN21 = ("qwen_image21",)  # Qwen-Image 2.1 (engine.denoise.qwen_image21)
NEXTDIT = ("z_image", "lumina2")  # engine.denoise.nextdit
AURAFLOW = ("auraflow",)  # AuraFlow v0.1–0.3 and Pony V7 (engine.denoise.auraflow)
HUNYUAN_VIDEO = ("hunyuan_video",)  # HunyuanVideo 1.0 t2v / i2v, SkyReels (engine.denoise.hunyuan_video)
HUNYUAN_VIDEO15 = ("hunyuan_video15",)  # HunyuanVideo 1.5 t2v / i2v (engine.denoise.hunyuan_video15)
LTXV = ("ltxv",)  # LTX-Video 0.9.x, 2B and 13B (engine.denoise.ltxv)
LTX2 = ("ltx2",)  # LTX-2's audio-video transformer, 19B (and the LTX-2.3 / 2.5 layouts) (engine.denoise.ltx2)
KREA2 = ("krea2",)  # Krea 2 (engine.denoise.krea2)
SANA = ("sana",)  # Sana 600M / 1600M, Sana 1.5 4.8B (engine.denoise.sana)
PIXART = ("pixart",)  # PixArt-α and PixArt-Σ, 256 to 2K (engine.denoise.pixart)
HUNYUAN_DIT = ("hunyuan_dit",)  # Hunyuan-DiT v1.0 / v1.1 / v1.2, distilled (engine.denoise.hunyuan_dit)
HIDREAM = ("hidream",)  # HiDream-I1 Full / Dev / Fast, and HiDream-E1 on its layout (engine.denoise.hidream)
HUNYUAN_IMAGE = ("hunyuan_image21",)  # HunyuanImage 2.1 (engine.denoise.hunyuan_image)
MOCHI = ("mochi",)  # Mochi 1 (Genmo's 10B asymmetric joint DiT) (engine.denoise.mochi)
# MiniMax-H3's packed video + text + audio transformer (engine.denoise.minimax_h3)
MINIMAX_H3 = ("minimax_h3",)
STABLE_CASCADE = ("stable_cascade_c", "stable_cascade_b")  # Stage C and B (engine.denoise.stable_cascade)
COSMOS = ("cosmos_predict2",)  # Cosmos Predict2 Text2Image / Video2World, 2B and 14B (engine.denoise.cosmos)
# Families whose module says all about itself: architecture -> its module in engine.denoise, which exposes
# `bind(ops, mods, architecture, dtype) -> (naming, model)`; the model names its inputs (`step_inputs`, required, and
# `step_optional`) and answers `step_shapes(got)` and `step_random(width, height, batch, g)` (engine.denoise.inputs,
# input_shapes and random_inputs ask it first). A new family adds its module and one line here, nothing in those
# dispatchers (the plan's, catalog's and LoRA tables still take their one entry each: ARCHITECTURE.md).
SELF_DESCRIBED = {
    "ernie_image": "ernie_image",  # ERNIE-Image
    "bria": "bria",  # Bria 3.2 (FLUX.1's blocks, no pooled vector)
    "bria_fibo": "bria",  # Bria FIBO (Bria 3.2's, a text-encoder layer into each block)
    "glm_image": "glm_image",  # GLM-Image
    "ideogram4": "ideogram4",  # Ideogram 4
    "prx": "prx",  # PRX (Photoroom): latent and pixel-space
    "joyimage": "joyimage",  # JoyImage Edit and Edit Plus (one layout)
    "longcat_image": "longcat_image",  # LongCat-Image (and -Edit)
    "ovis_image": "longcat_image",  # Ovis-Image: LongCat-Image's module, its SwiGLU MLPs and text norm
    "kandinsky5": "kandinsky5",  # Kandinsky 5 (T2V / I2V Lite and Pro, Image Lite T2I / I2I)
    "sana_video": "sana_video",  # SANA-Video (Sana's linear attention with RoPE and a temporal Mix-FFN)
    "nucleus_image": "nucleus_image",  # NucleusMoE-Image (expert-choice MoE image MLPs)
    "motif_video": "motif_video",  # Motif-Video (FLUX.1's blocks on video)
    "cosmos_predict1": "cosmos1",  # Cosmos 1.0 7B / 14B Text2World, Video2World (Predict2's blocks + learnable pos.)
    "bria_fibo2": "bria_fibo2",  # Bria FIBO 2 (Z-Image's blocks, a Perceiver over the text, injection blocks)
    "kandinsky6": "kandinsky6",  # Kandinsky 6 (video with audio)
    "kandinsky6_sr": "kandinsky6_sr",  # Kandinsky 6 SR (NABLA attention)
}
SUPPORTED = (
    *(UNETS + FLUX + FLUX2 + FLUX3 + CHROMA + MMDIT + QWEN + QWEN21 + NEXTDIT + AURAFLOW + WAN),
    *(
        HUNYUAN_VIDEO
        + HUNYUAN_VIDEO15
        + HUNYUAN_IMAGE
        + LTXV
        + LTX2
        + COSMOS
        + KREA2
        + SANA
        + PIXART
        + HUNYUAN_DIT
        + HIDREAM
        + MOCHI
        + STABLE_CASCADE
        + MINIMAX_H3
    ),
    *SELF_DESCRIBED,
)
_MISFIT = re.compile(
    r"shapes cannot be multiplied|Given groups=|expected input\[|must match the size of tensor|"
    r"size of tensor a|is invalid for input of size|Expected weight to be a vector|normalized_shape|"
    r"input to conv[123]d, but got input of size|split_with_sizes expects"
)


@dataclass
class Denoiser:
    """A bound forward pass: `kind` "unet", "flux" or "wan", the file's `naming`, and the model to call."""

    kind: str
    architecture: str
    naming: str
    model: object

    def __call__(self, inputs: dict):
        return self._run(self.model, inputs)

    def outputs(self, inputs: dict) -> dict:
        """Every output of a forward by name: `out` (what calling it returns) and, for a model with a second
        stream, that stream's (LTX-2's audio: `audio_out`)."""
        both = getattr(self.model, "outputs", None)
        return self._run(both, inputs) if both is not None else {"out": self(inputs)}

    def _run(self, forward, inputs: dict):
        try:
            return forward(**inputs)
        except (AttributeError, NotImplementedError) as e:
            raise FormatError(f"{self._what()} ({e}): a damaged or edited file?") from e
        except RuntimeError as e:
            # torch's own words for a weight that does not fit its input: a layer of the wrong shape
            # (binding reads the architecture from a few shapes; a header edited elsewhere lands here)
            if type(e) is not RuntimeError or not _MISFIT.search(str(e)):
                raise
            raise FormatError(f"{self._what()} ({str(e).splitlines()[0]}): a damaged or edited file?") from e

    def _what(self) -> str:
        return f"the file's layers do not compute as a {self.architecture} {self.kind}"

    @property
    def input_names(self) -> tuple[str, ...]:
        return names(self.model)

    def op_order(self) -> list:
        return self.model.op_order()

    def random_inputs(self, width: int, height: int, *, batch: int = 1, seed: int = 0) -> dict:
        return random_inputs(self.model, width, height, batch=batch, seed=seed)

    def check_inputs(self, tensors: dict, source: str) -> dict:
        return check_inputs(self.model, tensors, source)


def bind(component, architecture: str | None, dtype=None) -> Denoiser:
    """The forward pass of `component` (its castable ops, as they are now) for `architecture`, computing
    in `dtype` (default: the component's compute dtype)."""
    try:
        return _bind(component, architecture, dtype)
    except AttributeError as e:  # an op of another kind than the layout's (a norm's scale of 2 dims)
        raise FormatError(
            f"{component.name} of {component.path}: its layers are not those of a {architecture} ({e}): "
            "a damaged or edited file?"
        ) from e


def _bind(component, architecture: str | None, dtype=None) -> Denoiser:
    import torch

    from ..model.dtypes import role_of

    mods = {u.path: u.module for u in component.units}
    if role_of(component.name) == "text_encoder":
        return _bind_text(component, mods, dtype or getattr(torch, component.compute_dtype))
    if architecture is None and _is_mmdit(mods):
        architecture = "mmdit"  # joint blocks of no release's size: an MMDiT is read from its shapes
    if architecture not in SUPPORTED:
        raise UnsupportedModel(
            f"{component.name}: no forward pass for {architecture or 'an unknown architecture'} yet "
            f"(Loadout runs {', '.join(SUPPORTED)})"
        )
    dtype = dtype or getattr(torch, component.compute_dtype)
    what = f"{component.name} of {component.path}"
    ops = Ops(mods, what)
    den = _bind_denoiser(ops, mods, architecture, dtype, what)
    unused = unused_layers(mods, ops)
    if unused:
        # a forward that skipped them would compute another model than the file's, with no error
        raise UnsupportedModel(
            f"{what}: {len(unused)} of its layers are not computed by Loadout's {architecture} forward "
            f"({', '.join(unused[:3])}{', …' if len(unused) > 3 else ''}): a variant it cannot run yet"
        )
    return den


def _bind_denoiser(ops: Ops, mods: dict, architecture: str, dtype, what: str) -> Denoiser:
    """The forward for `architecture` over `ops` (each branch takes from it the layers it computes with,
    renamed onto the architecture's native paths where the file uses diffusers' names)."""
    if architecture in SELF_DESCRIBED:
        family = importlib.import_module(f".{SELF_DESCRIBED[architecture]}", __package__)
        naming, model = family.bind(ops, mods, architecture, dtype)
        return Denoiser(model.family, architecture, naming, model)
    if architecture in UNETS:
        from .unet import bind_unet

        naming = "ldm"
        if not any(p.startswith("input_blocks.") for p in mods):
            from ..lora.unet_names import diffusers_to_ldm

            naming, to_ldm = "diffusers", diffusers_to_ldm(mods)
            ops = ops.renamed({to_ldm[p]: m for p, m in mods.items() if p in to_ldm})
        return Denoiser("unet", architecture, naming, bind_unet(ops, architecture, dtype))
    if architecture in MMDIT:
        from . import mmdit

        if "x_embedder.proj" in mods:
            root = mods.get("")
            if root is not None:
                ops.take(root)  # its top-level `pos_embed`
            return Denoiser("mmdit", architecture, "sai", mmdit.bind_native(ops, architecture, dtype, root))
        return Denoiser("mmdit", architecture, "diffusers", mmdit.bind_diffusers(ops, architecture, dtype))
    if architecture in QWEN:
        from .qwen_image import bind_qwen_image

        return Denoiser("qwen_image", architecture, "diffusers", bind_qwen_image(ops, architecture, dtype))
    if architecture in QWEN21:
        from .qwen_image21 import bind_qwen_image21

        naming, model = bind_qwen_image21(ops, mods, architecture, dtype)
        return Denoiser("qwen_image21", architecture, naming, model)
    if architecture in NEXTDIT:
        from .nextdit import bind_nextdit

        naming, model = bind_nextdit(ops, mods, architecture, dtype)
        return Denoiser("nextdit", architecture, naming, model)
    if architecture in AURAFLOW:
        from .auraflow import bind_auraflow

        naming, model = bind_auraflow(ops, mods, architecture, dtype)
        return Denoiser("auraflow", architecture, naming, model)
    if architecture in HUNYUAN_VIDEO:
        from .hunyuan_video_bind import bind_hunyuan_video

        naming, model = bind_hunyuan_video(ops, mods, architecture, dtype)
        return Denoiser("hunyuan_video", architecture, naming, model)
    if architecture in HUNYUAN_IMAGE:
        from .hunyuan_image import bind_hunyuan_image

        naming, model = bind_hunyuan_image(ops, mods, architecture, dtype)
        return Denoiser("hunyuan_image21", architecture, naming, model)
    if architecture in PIXART:
        from .pixart import bind_pixart

        naming, model = bind_pixart(ops, mods, architecture, dtype)
        return Denoiser("pixart", architecture, naming, model)
    if architecture in HUNYUAN_DIT:
        from .hunyuan_dit import bind_hunyuan_dit

        naming, model = bind_hunyuan_dit(ops, mods, architecture, dtype)
        return Denoiser("hunyuan_dit", architecture, naming, model)
    if architecture in SANA:
        from .sana import bind_sana

        naming, model = bind_sana(ops, mods, architecture, dtype)
        return Denoiser("sana", architecture, naming, model)
    if architecture in HIDREAM:
        from .hidream import bind_hidream

        return Denoiser("hidream", architecture, "diffusers", bind_hidream(ops, architecture, dtype))
    if architecture in KREA2:
        from .krea2 import bind_krea2

        naming, model = bind_krea2(ops, mods, architecture, dtype)
        return Denoiser("krea2", architecture, naming, model)
    if architecture in COSMOS:
        from .cosmos import bind_cosmos

        naming, model = bind_cosmos(ops, mods, architecture, dtype)
        return Denoiser("cosmos", architecture, naming, model)
    if architecture in STABLE_CASCADE:
        from .stable_cascade import bind_stable_cascade

        naming, model = bind_stable_cascade(ops, mods, architecture, dtype)
        return Denoiser(architecture, architecture, naming, model)  # two stages, two activation profiles
    if architecture in MOCHI:
        from .mochi import bind_mochi

        naming, model = bind_mochi(ops, mods, architecture, dtype)
        return Denoiser("mochi", architecture, naming, model)
    if architecture in MINIMAX_H3:
        from .minimax_h3 import bind_minimax_h3

        naming, model = bind_minimax_h3(ops, mods, architecture, dtype)
        return Denoiser("minimax_h3", architecture, naming, model)
    if architecture in LTXV:
        from .ltxv import bind_ltxv

        naming, model = bind_ltxv(ops, mods, architecture, dtype)
        return Denoiser("ltxv", architecture, naming, model)
    if architecture in LTX2:
        from .ltx2_bind import bind_ltx2

        naming, model = bind_ltx2(ops, mods, architecture, dtype)
        return Denoiser("ltx2", architecture, naming, model)
    if architecture in HUNYUAN_VIDEO15:
        from .hunyuan_video15 import bind_hunyuan_video15

        naming, model = bind_hunyuan_video15(ops, mods, architecture, dtype)
        return Denoiser("hunyuan_video15", architecture, naming, model)
    if architecture in WAN:
        from .wan_animate2 import bind_wan_animate2, is_animate2

        # Wan-Animate-2's wrapped or diffusers-named blocks (engine.denoise.wan_animate2)
        if is_animate2(mods):
            naming, model = bind_wan_animate2(ops, mods, architecture, dtype)
            return Denoiser("wan", architecture, naming, model)
        from .. import ops as castable
        from .wan import bind_wan
        from .wan_animate import bind_wan_animate, diffusers_paths, is_animate

        plain = {p: m for p, m in mods.items() if not isinstance(m, castable.Castable)}
        cast = {p: m for p, m in mods.items() if isinstance(m, castable.Castable)}
        naming = "original"
        if not ops_in_original_naming(mods):  # diffusers' WanTransformer3DModel: renamed onto the original
            from ..lora.family_names import WAN as WAN_NAMES
            from ..lora.family_names import to_original

            animate = diffusers_paths(mods) if is_animate(mods) else {}  # WanAnimateTransformer3DModel's own
            from .wan_variants import DIFFUSERS as VARIANTS  # SkyReels-V2's and AnyFlow's own layers

            naming, rename = "diffusers", {**to_original(cast, WAN_NAMES), **animate}
            rename.update({p: o for p, o in VARIANTS.items() if p in cast})
            cast = {rename[p]: m for p, m in cast.items() if p in rename}
            # the per-block and head modulations are diffusers' `scale_shift_table`s; FLF2V's image
            # position embedding is its image embedder's `pos_embed`
            renamed = {"": "head", "condition_embedder.image_embedder": "img_emb", **animate}
            plain = {renamed.get(p, p): m for p, m in plain.items()}
        ops = ops.renamed(cast)
        if is_animate(mods):
            model = bind_wan_animate(ops, architecture, dtype, Taken(plain, ops))
        else:
            from .wan_variants import bind_variant, refuse

            refuse(ops)
            model = bind_variant(ops, bind_wan(ops, architecture, dtype, Taken(plain, ops)))
        return Denoiser("wan", architecture, naming, model)
    if architecture in FLUX3:
        from .flux3 import bind_flux3

        naming, model = bind_flux3(ops, mods, architecture, dtype)
        return Denoiser("flux3", architecture, naming, model)
    if architecture in FLUX2:
        from .flux2 import bind_flux2_bfl, bind_flux2_diffusers

        if "img_in" in mods:
            return Denoiser("flux", architecture, "bfl", bind_flux2_bfl(ops, architecture, dtype))
        return Denoiser("flux", architecture, "diffusers", bind_flux2_diffusers(ops, architecture, dtype))
    from .flux import bind_bfl, bind_diffusers

    if "img_in" in mods or any(p.startswith("double_blocks.") for p in mods):
        return Denoiser("flux", architecture, "bfl", bind_bfl(ops, architecture, dtype))
    return Denoiser("flux", architecture, "diffusers", bind_diffusers(ops, architecture, dtype))


__all__ = ["FLUX", "SUPPORTED", "UNETS", "Denoiser", "bind"]


def _bind_text(component, mods, dtype) -> Denoiser:
    """A text encoder component: transformers' CLIP or T5 class on the component's ops (engine.denoise.text)."""
    from . import text

    what = f"{component.name} of {component.path}"
    if "text_model.embeddings.token_embedding" in mods:
        model = text.bind_clip(Ops(mods, what), component.name, dtype)
    elif "encoder.block.0.layer.0.SelfAttention.q" in mods:
        model = text.bind_t5(Ops(mods, what), component.name, dtype)
    elif any(p.startswith("transformer.resblocks.") for p in mods):
        raise UnsupportedModel(
            f"{what}: an OpenCLIP-named CLIP (as SDXL checkpoints store CLIP-G) is not stepped yet; the same "
            "encoder in transformers' naming (ComfyUI's clip_g.safetensors) is"
        )
    else:
        raise UnsupportedModel(
            f"{what}: Loadout steps CLIP and T5 text encoders in transformers' naming, not this one yet"
        )
    return Denoiser("text", component.name, "transformers", model)


def _is_mmdit(mods) -> bool:
    """SD3's joint blocks, in Stability's or diffusers' naming."""
    return "joint_blocks.0.context_block.attn.qkv" in mods or (
        "pos_embed.proj" in mods and "transformer_blocks.0.norm1_context.linear" in mods
    )


def ops_in_original_naming(mods) -> bool:
    """Wan's original module paths (`time_embedding.0`, `blocks.N.self_attn.q`), not diffusers'."""
    return "time_embedding.0" in mods
