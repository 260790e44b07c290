"""Stable Cascade stage C (prior) and stage B (decoder) in Stability's native naming.

Structure (Stability-AI/StableCascade `modules/stage_c.py`, `stage_b.py`, `common.py`; diffusers
StableCascadeUNet mirrors it and its single-file converter only splits the attention): ResBlock =
depthwise conv (groups=c, no bias change), channelwise.{0: Linear(c+skip -> 4c), 2: GlobalResponseNorm
gamma/beta [1,1,1,4c], 4: Linear(4c -> c)}; TimestepBlock = mapper (+ mapper_<cond> per extra timestep
condition), Linear(c_r -> 2c); AttnBlock = kv_mapper.1 Linear(c_cond -> c) and attention.attn, a
torch MultiheadAttention (in_proj_weight/bias, out_proj). Levels are joined by down_downscalers.i.1 /
up_upscalers.i.1 (a 2x2 strided conv / transposed conv, or a 1x1 `blocks.{0|1}` conv when switch_level
is given), per-level repeat mappers, embedding.1 (1x1 conv after pixel-unshuffle), clf.1 (1x1 conv).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._build import Builder


@dataclass(frozen=True)
class CascadeConfig:
    c_in: int
    c_out: int
    patch: int
    c_cond: int
    c_hidden: tuple[int, ...]
    nhead: tuple[int, ...]
    blocks_down: tuple[int, ...]
    blocks_up: tuple[int, ...]
    repeat_down: tuple[int, ...]
    repeat_up: tuple[int, ...]
    level: tuple[str, ...]  # per level: "CT" or "CTA" (ResBlock, TimestepBlock, AttnBlock)
    t_conds: tuple[str, ...]
    c_r: int = 64
    clip_seq: int = 4
    clip_text: int | None = None
    clip_text_pooled: int = 1280
    clip_img: int | None = None
    effnet: int | None = None
    pixels: int | None = None
    # StageC's switch_level=[False]: levels are joined by UpDownBlock2d (a 1x1 `blocks.{0|1}` mapping conv,
    # resampling disabled) instead of the strided conv / transposed conv StageB uses (switch_level None)
    updown_blocks: bool = False


# StableCascade configs/inference/stage_c_3b.yaml (= diffusers stable-cascade-prior prior/config.json):
# c_in 16, patch 1, c_cond 2048, c_hidden [2048, 2048], nhead [32, 32], blocks [[8, 24], [24, 8]],
# level_config CTA, clip text 1280 / pooled 1280 / image 768, t_conds sca + crp, switch_level [False].
STAGE_C = CascadeConfig(
    16,
    16,
    1,
    2048,
    (2048, 2048),
    (32, 32),
    (8, 24),
    (24, 8),
    (1, 1),
    (1, 1),
    ("CTA", "CTA"),
    ("sca", "crp"),
    clip_text=1280,
    clip_img=768,
    updown_blocks=True,
)
# stage_c_1b ("lite"): c_hidden [1536, 1536], nhead [24, 24], blocks [[4, 12], [12, 4]].
STAGE_C_LITE = CascadeConfig(
    16,
    16,
    1,
    1536,
    (1536, 1536),
    (24, 24),
    (4, 12),
    (12, 4),
    (1, 1),
    (1, 1),
    ("CTA", "CTA"),
    ("sca", "crp"),
    clip_text=1280,
    clip_img=768,
    updown_blocks=True,
)
# stage_b_3b.yaml (= stable-cascade decoder/config.json): c_in 4, patch 2, c_cond 1280, c_hidden
# [320, 640, 1280, 1280], nhead [-, -, 20, 20], blocks [[2, 6, 28, 6], [6, 28, 6, 2]], block_repeat
# [[1, 1, 1, 1], [3, 3, 2, 2]], level_config CT CT CTA CTA, effnet 16, pixels 3, t_conds sca.
STAGE_B = CascadeConfig(
    4,
    4,
    2,
    1280,
    (320, 640, 1280, 1280),
    (0, 0, 20, 20),
    (2, 6, 28, 6),
    (6, 28, 6, 2),
    (1, 1, 1, 1),
    (3, 3, 2, 2),
    ("CT", "CT", "CTA", "CTA"),
    ("sca",),
    effnet=16,
    pixels=3,
)
# stage_b "700M" (StableCascade train/train_b.py model_version 700M): c_hidden [320, 576, 1152, 1152],
# nhead [-, 9, 18, 18], blocks [[2, 4, 14, 4], [4, 14, 4, 2]], block_repeat [[1, 1, 1, 1], [2, 2, 2, 2]].
STAGE_B_LITE = CascadeConfig(
    4,
    4,
    2,
    1280,
    (320, 576, 1152, 1152),
    (0, 9, 18, 18),
    (2, 4, 14, 4),
    (4, 14, 4, 2),
    (1, 1, 1, 1),
    (2, 2, 2, 2),
    ("CT", "CT", "CTA", "CTA"),
    ("sca",),
    effnet=16,
    pixels=3,
)


def _block(b: Builder, key: str, kind: str, c: int, cfg: CascadeConfig, skip: int = 0) -> None:
    if kind == "C":
        b.conv(f"{key}.depthwise", c, 1, k=3)
        b.linear(f"{key}.channelwise.0", 4 * c, c + skip)
        b.t(f"{key}.channelwise.2.gamma", (1, 1, 1, 4 * c))
        b.t(f"{key}.channelwise.2.beta", (1, 1, 1, 4 * c))
        b.linear(f"{key}.channelwise.4", c, 4 * c)
    elif kind == "T":
        b.linear(f"{key}.mapper", 2 * c, cfg.c_r)
        for cond in cfg.t_conds:
            b.linear(f"{key}.mapper_{cond}", 2 * c, cfg.c_r)
    else:  # "A"
        b.linear(f"{key}.kv_mapper.1", c, cfg.c_cond)
        b.t(f"{key}.attention.attn.in_proj_weight", (3 * c, c))
        b.t(f"{key}.attention.attn.in_proj_bias", (3 * c,))
        b.linear(f"{key}.attention.attn.out_proj", c, c)


def cascade_native(b: Builder, cfg: CascadeConfig) -> None:
    ch = cfg.c_hidden
    if cfg.effnet:
        b.conv("effnet_mapper.0", 4 * ch[0], cfg.effnet, k=1)
        b.conv("effnet_mapper.2", ch[0], 4 * ch[0], k=1)
    if cfg.pixels:
        b.conv("pixels_mapper.0", 4 * ch[0], cfg.pixels, k=1)
        b.conv("pixels_mapper.2", ch[0], 4 * ch[0], k=1)
    if cfg.clip_text:
        b.linear("clip_txt_mapper", cfg.c_cond, cfg.clip_text)
    # stage B names its pooled-text mapper clip_mapper (diffusers renames it clip_txt_pooled_mapper)
    b.linear(
        "clip_txt_pooled_mapper" if cfg.clip_text else "clip_mapper",
        cfg.c_cond * cfg.clip_seq,
        cfg.clip_text_pooled,
    )
    if cfg.clip_img:
        b.linear("clip_img_mapper", cfg.c_cond * cfg.clip_seq, cfg.clip_img)
    b.conv("embedding.1", ch[0], cfg.c_in * cfg.patch**2, k=1)
    n = len(ch)
    for i in range(n):
        if i > 0:
            if cfg.updown_blocks:
                b.conv(f"down_downscalers.{i}.1.blocks.0", ch[i], ch[i - 1], k=1)
            else:
                b.conv(f"down_downscalers.{i}.1", ch[i], ch[i - 1], k=2)
        j = 0
        for _ in range(cfg.blocks_down[i]):
            for kind in cfg.level[i]:
                _block(b, f"down_blocks.{i}.{j}", kind, ch[i], cfg)
                j += 1
        for r in range(cfg.repeat_down[i] - 1):
            b.conv(f"down_repeat_mappers.{i}.{r}", ch[i], ch[i], k=1)
    for u, i in enumerate(reversed(range(n))):
        if i > 0:
            if cfg.updown_blocks:
                b.conv(f"up_upscalers.{u}.1.blocks.1", ch[i - 1], ch[i], k=1)
            else:  # ConvTranspose2d weight is [in, out, k, k]
                b.t(f"up_upscalers.{u}.1.weight", (ch[i], ch[i - 1], 2, 2))
                b.t(f"up_upscalers.{u}.1.bias", (ch[i - 1],))
        j = 0
        for layer in range(cfg.blocks_up[::-1][i]):
            for k, kind in enumerate(cfg.level[i]):
                skip = ch[i] if i < n - 1 and layer == k == 0 else 0
                _block(b, f"up_blocks.{u}.{j}", kind, ch[i], cfg, skip=skip)
                j += 1
        for r in range(cfg.repeat_up[::-1][i] - 1):
            b.conv(f"up_repeat_mappers.{u}.{r}", ch[i], ch[i], k=1)
    b.conv("clf.1", cfg.c_out * cfg.patch**2, ch[0], k=1)
