"""Image transformers in their original codebases' naming (what ComfyUI's repackaged files keep)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .common import Rows


# --- FLUX.1 / Chroma / FLUX.2 (BFL naming) -----------------------------------------------------------
# black-forest-labs/flux `src/flux/model.py` + `modules/layers.py` (DoubleStreamBlock, SingleStreamBlock,
# MLPEmbedder, LastLayer; configs in `util.py`); lodestones/Chroma (FLUX.1-schnell blocks without
# per-block modulation, `distilled_guidance_layer` = Approximator with in_proj, layers.N.{in,out}_layer,
# norms.N.scale, out_proj); black-forest-labs/flux2 `src/flux2/model.py` (no biases, shared modulation,
# SwiGLU MLP). FLUX.2 klein sizes: mflux `models/common/config/model_config.py`.
@dataclass(frozen=True)
class FluxConfig:
    hidden: int = 3072
    heads: int = 24
    depth: int = 19
    single: int = 38
    in_channels: int = 64
    context: int = 4096
    guidance: bool = True
    kind: str = "flux1"  # flux1 | chroma | flux2

    def with_(self, **kw) -> FluxConfig:
        return replace(self, **kw)


FLUX1_DEV = FluxConfig()
FLUX1_SCHNELL = FLUX1_DEV.with_(guidance=False)
FLUX1_FILL = FLUX1_DEV.with_(in_channels=384)
FLUX1_DEPTH = FLUX1_DEV.with_(in_channels=128)
CHROMA = FLUX1_SCHNELL.with_(kind="chroma")
FLUX2_DEV = FluxConfig(
    hidden=6144, heads=48, depth=8, single=48, in_channels=128, context=15360, kind="flux2"
)
FLUX2_KLEIN_4B = FLUX2_DEV.with_(hidden=3072, heads=24, depth=5, single=20, context=7680, guidance=False)
FLUX2_KLEIN_9B = FLUX2_DEV.with_(hidden=4096, heads=32, depth=8, single=24, context=12288, guidance=False)


def flux_bfl(c: FluxConfig) -> Rows:
    r = Rows()
    h, hd = c.hidden, c.hidden // c.heads
    two = c.kind == "flux2"
    bias = not two
    mlp = h * 3 if two else h * 4
    r.lin("img_in", h, c.in_channels, bias)
    r.lin("txt_in", h, c.context, bias)
    if c.kind == "chroma":
        g = "distilled_guidance_layer"
        r.lin(f"{g}.in_proj", 5120, 64)
        for n in range(5):
            r.lin(f"{g}.layers.{n}.in_layer", 5120, 5120)
            r.lin(f"{g}.layers.{n}.out_layer", 5120, 5120)
            r.t(f"{g}.norms.{n}.scale", (5120,))
        r.lin(f"{g}.out_proj", h, 5120)
    else:
        for e in ("time_in", "guidance_in") if c.guidance else ("time_in",):
            r.lin(f"{e}.in_layer", h, 256, bias)
            r.lin(f"{e}.out_layer", h, h, bias)
        if not two:
            r.lin("vector_in.in_layer", h, 768)
            r.lin("vector_in.out_layer", h, h)
    if two:
        r.lin("double_stream_modulation_img.lin", 6 * h, h, False)
        r.lin("double_stream_modulation_txt.lin", 6 * h, h, False)
        r.lin("single_stream_modulation.lin", 3 * h, h, False)
    for i in range(c.depth):
        for s in ("img", "txt"):
            k = f"double_blocks.{i}.{s}"
            if c.kind == "flux1":
                r.lin(f"{k}_mod.lin", 6 * h, h)
            r.lin(f"{k}_attn.qkv", 3 * h, h, bias)
            r.t(f"{k}_attn.norm.query_norm.scale", (hd,))
            r.t(f"{k}_attn.norm.key_norm.scale", (hd,))
            r.lin(f"{k}_attn.proj", h, h, bias)
            r.lin(f"{k}_mlp.0", 2 * mlp if two else mlp, h, bias)
            r.lin(f"{k}_mlp.2", h, mlp, bias)
    for i in range(c.single):
        k = f"single_blocks.{i}"
        r.lin(f"{k}.linear1", 3 * h + (2 * mlp if two else mlp), h, bias)
        r.lin(f"{k}.linear2", h, h + mlp, bias)
        r.t(f"{k}.norm.query_norm.scale", (hd,))
        r.t(f"{k}.norm.key_norm.scale", (hd,))
        if c.kind == "flux1":
            r.lin(f"{k}.modulation.lin", 3 * h, h)
    if c.kind != "chroma":
        r.lin("final_layer.adaLN_modulation.1", 2 * h, h, bias)
    r.lin("final_layer.linear", c.in_channels if two else 64, h, bias)
    return r


def flux_diffusers_config(c: FluxConfig, depth: int | None = None, single: int | None = None) -> dict:
    """FluxTransformer2DModel / ChromaTransformer2DModel / Flux2Transformer2DModel arguments."""
    cfg = dict(
        num_layers=c.depth if depth is None else depth,
        num_single_layers=c.single if single is None else single,
        num_attention_heads=c.heads,
        attention_head_dim=c.hidden // c.heads,
        joint_attention_dim=c.context,
    )
    if c.kind == "flux2":
        cfg.update(in_channels=c.in_channels, guidance_embeds=c.guidance)
    elif c.kind == "flux1":
        cfg.update(in_channels=c.in_channels, out_channels=64, guidance_embeds=c.guidance)
    return cfg
