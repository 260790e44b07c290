"""VAE and text-encoder layouts in their original codebases' naming."""

from __future__ import annotations

from .common import Rows


# --- Wan 2.1 / 2.2 VAE ---------------------------------------------------------------------------------
# Wan-Video/Wan2.1 `wan/modules/vae.py` (WanVAE_, Encoder3d, Decoder3d, ResidualBlock = residual.{0 RMS
# gamma, 2 CausalConv3d, 3 gamma, 6 CausalConv3d} + shortcut, AttentionBlock, Resample) and Wan2.2
# `wan/modules/vae2_2.py` (Down_/Up_ResidualBlock nesting, 12-channel patchified input, dec_dim 256).
def _res(r: Rows, k: str, i: int, o: int) -> None:
    r.t(f"{k}.residual.0.gamma", (i, 1, 1, 1))
    r.conv(f"{k}.residual.2", o, i, (3, 3, 3))
    r.t(f"{k}.residual.3.gamma", (o, 1, 1, 1))
    r.conv(f"{k}.residual.6", o, o, (3, 3, 3))
    if i != o:
        r.conv(f"{k}.shortcut", o, i, (1, 1, 1))


def _attn(r: Rows, k: str, d: int) -> None:
    r.t(f"{k}.norm.gamma", (d, 1, 1))
    r.conv(f"{k}.to_qkv", 3 * d, d, (1, 1))
    r.conv(f"{k}.proj", d, d, (1, 1))


def _resample(r: Rows, k: str, d: int, mode: str, half: bool) -> None:
    if mode.startswith("up"):
        r.conv(f"{k}.resample.1", d // 2 if half else d, d, (3, 3))
        if mode == "up3d":
            r.conv(f"{k}.time_conv", 2 * d, d, (3, 1, 1))
    else:
        r.conv(f"{k}.resample.1", d, d, (3, 3))
        if mode == "down3d":
            r.conv(f"{k}.time_conv", d, d, (3, 1, 1))


def wan_vae_original(version: str = "2.1", image_channels: int = 3) -> Rows:
    two = version == "2.2"
    dim, dec, z = (160, 256, 48) if two else (96, 96, 16)
    image = 12 if two else image_channels
    mult, t_down = [1, 2, 4, 4], [False, True, True]
    r = Rows()
    dims = [dim * m for m in [1, *mult]]
    r.conv("encoder.conv1", dims[0], image, (3, 3, 3))
    n = 0
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        down = i != len(mult) - 1
        mode = "down3d" if down and t_down[i] else "down2d"
        if two:
            for j in range(2):
                _res(r, f"encoder.downsamples.{i}.downsamples.{j}", a if j == 0 else b, b)
            if down:
                _resample(r, f"encoder.downsamples.{i}.downsamples.2", b, mode, False)
        else:
            for j in range(2):
                _res(r, f"encoder.downsamples.{n}", a if j == 0 else b, b)
                n += 1
            if down:
                _resample(r, f"encoder.downsamples.{n}", b, mode, False)
                n += 1
    top = dims[-1]
    for side, d in (("encoder", top), ("decoder", dec * mult[-1])):
        _res(r, f"{side}.middle.0", d, d)
        _attn(r, f"{side}.middle.1", d)
        _res(r, f"{side}.middle.2", d, d)
    r.t("encoder.head.0.gamma", (top, 1, 1, 1))
    r.conv("encoder.head.2", 2 * z, top, (3, 3, 3))
    r.conv("conv1", 2 * z, 2 * z, (1, 1, 1))
    r.conv("conv2", z, z, (1, 1, 1))
    ddims = [dec * m for m in [mult[-1], *mult[::-1]]]
    r.conv("decoder.conv1", ddims[0], z, (3, 3, 3))
    n = 0
    for i, (a, b) in enumerate(zip(ddims[:-1], ddims[1:], strict=True)):
        up = i != len(mult) - 1
        mode = "up3d" if up and t_down[::-1][i] else "up2d"
        if two:
            for j in range(3):
                _res(r, f"decoder.upsamples.{i}.upsamples.{j}", a if j == 0 else b, b)
            if up:
                _resample(r, f"decoder.upsamples.{i}.upsamples.3", b, mode, False)
        else:
            a = a // 2 if i in (1, 2, 3) else a  # the previous upsample halved the width
            for j in range(3):
                _res(r, f"decoder.upsamples.{n}", a if j == 0 else b, b)
                n += 1
            if up:
                _resample(r, f"decoder.upsamples.{n}", b, mode, True)
                n += 1
    r.t("decoder.head.0.gamma", (ddims[-1], 1, 1, 1))
    r.conv("decoder.head.2", image, ddims[-1], (3, 3, 3))
    return r


def wan22_vae_diffusers_config() -> dict:
    """AutoencoderKLWan arguments of the Wan 2.2 VAE (Wan2.2 vae2_2.py: dim 160, dec_dim 256, z 48)."""
    return dict(
        base_dim=160,
        decoder_base_dim=256,
        z_dim=48,
        is_residual=True,
        in_channels=12,
        out_channels=12,
        patch_size=2,
        scale_factor_spatial=16,
    )


# --- HunyuanVideo VAE in ComfyUI's LDM naming ----------------------------------------------------------
# ComfyUI sd.py loads it as an LDM AutoencoderKL with conv3d (decoder.conv_in.conv, mid.block_1, up.N.block.M,
# norm_out, nin_shortcut); the diffusers <-> LDM VAE names are those of diffusers' convert_ldm_vae_checkpoint
# (down.N.block.M <-> down_blocks.N.resnets.M, mid.attn_1.{q,k,v,proj_out} <-> mid_block.attentions.0.
# {to_q,to_k,to_v,to_out.0}, the up list in reverse order).
def hunyuan_vae_ldm(diffusers_shapes: dict[str, tuple[int, ...]], up_blocks: int = 4) -> Rows:
    r = Rows()
    for k, s in diffusers_shapes.items():
        segs = k.split(".")
        side = segs[0]
        if len(segs) > 3 and segs[1] in ("down_blocks", "up_blocks"):
            i = int(segs[2])
            n = i if segs[1] == "down_blocks" else up_blocks - 1 - i
            head = f"{side}.{'down' if segs[1] == 'down_blocks' else 'up'}.{n}"
            rest = segs[3:]
            if rest[0] == "resnets":
                k = f"{head}.block.{rest[1]}." + ".".join(rest[2:])
            else:  # downsamplers.0 / upsamplers.0
                k = f"{head}.{'downsample' if rest[0] == 'downsamplers' else 'upsample'}." + ".".join(
                    rest[2:]
                )
        elif len(segs) > 3 and segs[1] == "mid_block":
            if segs[2] == "resnets":
                k = f"{side}.mid.block_{int(segs[3]) + 1}." + ".".join(segs[4:])
            else:
                names = {"to_q": "q", "to_k": "k", "to_v": "v", "to_out": "proj_out", "group_norm": "norm"}
                rest = [s for s in segs[4:] if s != "0"]
                k = f"{side}.mid.attn_1.{names.get(rest[0], rest[0])}." + ".".join(rest[1:])
        k = k.replace("conv_norm_out", "norm_out").replace("conv_shortcut", "nin_shortcut")
        r.t(k, s)
    return r


# --- Mochi VAE decoder (genmo naming) --------------------------------------------------------------------
# genmoai/mochi `vae/models.py` Decoder (as ComfyUI comfy/ldm/genmo/vae/model.py keeps it): blocks[0] = 1x1x1
# Conv3d from 12 latent channels + ResBlocks, three CausalUpsampleBlocks (ResBlocks then a Conv1x1 `proj`
# to out x t x s x s), a last stage of ResBlocks, `output_proj`; ResBlock.stack = [GroupNorm, SiLU, PConv3d,
# GroupNorm, SiLU, PConv3d]. base 128, multipliers [1, 2, 4, 6], res blocks [3, 3, 4, 6, 3], temporal
# expansions [1, 2, 3], spatial 2.
def mochi_vae_decoder() -> Rows:
    r = Rows()
    ch = [128, 256, 512, 768]

    def res(k: str, c: int) -> None:
        r.norm(f"{k}.stack.0", c)
        r.conv(f"{k}.stack.2", c, c, (3, 3, 3))
        r.norm(f"{k}.stack.3", c)
        r.conv(f"{k}.stack.5", c, c, (3, 3, 3))

    r.conv("blocks.0.0", ch[-1], 12, (1, 1, 1))
    for j in range(3):
        res(f"blocks.0.{j + 1}", ch[-1])
    for i, (n, t) in enumerate(((6, 3), (4, 2), (3, 1))):
        c_in, c_out = ch[3 - i], ch[2 - i]
        for j in range(n):
            res(f"blocks.{i + 1}.blocks.{j}", c_in)
        r.lin(f"blocks.{i + 1}.proj", c_out * t * 4, c_in)
    for j in range(3):
        res(f"blocks.4.{j}", ch[0])
    r.lin("output_proj", 3, ch[0])
    return r


# --- LTX-Video / LTX-2 VAE (Lightricks naming) -------------------------------------------------------------
# Lightricks' causal_video_autoencoder numbers encoder and decoder stages in one flat list; diffusers'
# convert_ltx_vae_checkpoint_to_diffusers (0.9.0 table) and convert_ltx2_vae_to_diffusers list how each
# stage maps onto diffusers' nested blocks. Read backwards (diffusers path -> Lightricks index), they give
# the original names of any diffusers layout; longer paths first.
LTXV090_STAGES = {
    "decoder": [
        ("up_blocks.1.upsamplers.0", "up_blocks.2"), ("up_blocks.2.conv_in", "up_blocks.4"),
        ("up_blocks.2.upsamplers.0", "up_blocks.5"), ("up_blocks.3.conv_in", "up_blocks.7"),
        ("up_blocks.3.upsamplers.0", "up_blocks.8"), ("mid_block", "up_blocks.0"), ("up_blocks.0", "up_blocks.1"),
        ("up_blocks.1", "up_blocks.3"), ("up_blocks.2", "up_blocks.6"), ("up_blocks.3", "up_blocks.9"),
    ],
    "encoder": [
        ("down_blocks.0.downsamplers.0", "down_blocks.1"), ("down_blocks.0.conv_out", "down_blocks.2"),
        ("down_blocks.1.downsamplers.0", "down_blocks.4"), ("down_blocks.1.conv_out", "down_blocks.5"),
        ("down_blocks.2.downsamplers.0", "down_blocks.7"), ("down_blocks.0", "down_blocks.0"),
        ("down_blocks.1", "down_blocks.3"), ("down_blocks.2", "down_blocks.6"), ("down_blocks.3", "down_blocks.8"),
        ("mid_block", "down_blocks.9"),
    ],
}  # fmt: skip
LTX2_STAGES = {
    "decoder": [
        ("up_blocks.0.upsamplers.0", "up_blocks.1"), ("up_blocks.1.upsamplers.0", "up_blocks.3"),
        ("up_blocks.2.upsamplers.0", "up_blocks.5"), ("mid_block", "up_blocks.0"), ("up_blocks.0", "up_blocks.2"),
        ("up_blocks.1", "up_blocks.4"), ("up_blocks.2", "up_blocks.6"),
    ],
    "encoder": [
        *((f"down_blocks.{i}.downsamplers.0", f"down_blocks.{2 * i + 1}") for i in range(4)),
        *((f"down_blocks.{i}", f"down_blocks.{2 * i}") for i in range(4)),
        ("mid_block", "down_blocks.8"),
    ],
}  # fmt: skip


# LTX-2.3's video VAE (diffusers convert_ltx2_to_diffusers.py, LTX_2_3_VIDEO_VAE_RENAME_DICT): LTX-2's table plus a
# fourth decoder level, up_blocks.7 (its upsampler) and up_blocks.8
LTX23_STAGES = {
    "decoder": [
        *((f"up_blocks.{i}.upsamplers.0", f"up_blocks.{2 * i + 1}") for i in range(4)),
        ("mid_block", "up_blocks.0"),
        *((f"up_blocks.{i}", f"up_blocks.{2 * i + 2}") for i in range(4)),
    ],
    "encoder": LTX2_STAGES["encoder"],
}
# its released configuration (the same script's get_ltx2_video_vae_config, version "2.3")
LTX23_RELEASE = dict(
    block_out_channels=(256, 512, 1024, 1024), decoder_block_out_channels=(256, 512, 512, 1024),
    layers_per_block=(4, 6, 4, 2, 2), decoder_layers_per_block=(4, 6, 4, 2, 2),
    decoder_spatio_temporal_scaling=(True,) * 4, decoder_inject_noise=(False,) * 5,
    upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"), upsample_residual=(False,) * 4,
    upsample_factor=(2, 2, 1, 2), timestep_conditioning=False, decoder_spatial_padding_mode="zeros",
)  # fmt: skip


def ltx_vae_original(diffusers_shapes: dict[str, tuple[int, ...]], stages: dict, ltx2: bool = False) -> Rows:
    r = Rows()
    stats = {
        "latents_mean": "per_channel_statistics.mean-of-means",
        "latents_std": "per_channel_statistics.std-of-means",
    }
    for k, s in diffusers_shapes.items():
        if k in stats:
            r.t("vae." + stats[k], s)
            continue
        side, rest = k.split(".", 1)
        for new, old in stages.get(side, ()):
            if rest == new or rest.startswith(new + "."):
                rest = old + rest[len(new) :]
                break
        rest = rest.replace(".resnets.", ".res_blocks.")
        if not ltx2:
            rest = rest.replace("conv_shortcut.conv.", "conv_shortcut.").replace("norm3.", "norm3.norm.")
        r.t(f"vae.{side}.{rest}", s)
    return r


# --- umT5-XXL in Wan's own naming ------------------------------------------------------------------------
# Wan-Video/Wan2.1 `wan/modules/t5.py` (T5Encoder with token_embedding, blocks.N = T5SelfAttention {norm1,
# attn.{q,k,v,o}, norm2, ffn.{gate.0, fc1, fc2}, pos_embedding.embedding}, norm; umt5_xxl: vocabulary 256384,
# dim 4096, FFN 10240, 64 heads, 24 layers, 32 buckets, shared_pos False).
def umt5_wan(layers: int = 24) -> Rows:
    r = Rows()
    r.t("token_embedding.weight", (256384, 4096))
    for i in range(layers):
        k = f"blocks.{i}"
        r.t(f"{k}.norm1.weight", (4096,))
        for p in ("q", "k", "v", "o"):
            r.lin(f"{k}.attn.{p}", 4096, 4096, False)
        r.t(f"{k}.norm2.weight", (4096,))
        r.lin(f"{k}.ffn.gate.0", 10240, 4096, False)
        r.lin(f"{k}.ffn.fc1", 10240, 4096, False)
        r.lin(f"{k}.ffn.fc2", 4096, 10240, False)
        r.t(f"{k}.pos_embedding.embedding.weight", (32, 64))
    r.t("norm.weight", (4096,))
    return r
