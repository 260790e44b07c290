"""LDM/SGM UNet module paths <-> diffusers UNet2DConditionModel paths, derived from a layout.

The conversion is structural (facts from diffusers `scripts/convert_original_stable_diffusion_to_
diffusers.py` and `loaders/single_file_utils.py`, and ComfyUI `comfy/utils.py` `unet_to_diffusers`):
`input_blocks.0.0` is `conv_in`; each later input block is either a downsampler
(`input_blocks.n.0.op` -> `down_blocks.L.downsamplers.0.conv`, which starts the next level L) or a
resnet (`.0` -> `down_blocks.L.resnets.j`) with an optional attention (`.1` -> `down_blocks.L.attentions.j`);
output blocks come `num_res_blocks + 1` per level (`.0` resnet, `.1` attention, and an upsampler
`.conv` -> `up_blocks.L.upsamplers.0.conv` closing a level); `middle_block.0/1/2` are
`mid_block.resnets.0`, `mid_block.attentions.0`, `mid_block.resnets.1`. Inside a resnet `in_layers.0/2`,
`emb_layers.1`, `out_layers.0/3`, `skip_connection` are `norm1`, `conv1`, `time_emb_proj`, `norm2`,
`conv2`, `conv_shortcut`; attention blocks keep their inner names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_RESNET = (
    ("in_layers.0", "norm1"),
    ("in_layers.2", "conv1"),
    ("emb_layers.1", "time_emb_proj"),
    ("out_layers.0", "norm2"),
    ("out_layers.3", "conv2"),
    ("skip_connection", "conv_shortcut"),
)
_TOP = (
    ("input_blocks.0.0", "conv_in"),
    ("time_embed.0", "time_embedding.linear_1"),
    ("time_embed.2", "time_embedding.linear_2"),
    ("label_emb.0.0", "add_embedding.linear_1"),
    ("label_emb.0.2", "add_embedding.linear_2"),
    ("out.0", "conv_norm_out"),
    ("out.2", "conv_out"),
)


def _resnet_inner(rest: str) -> str | None:
    for ldm, diff in _RESNET:
        if rest == ldm or rest.startswith(ldm + "."):
            return diff + rest[len(ldm) :]
    return None


def ldm_to_diffusers(module_paths: Iterable[str]) -> dict[str, str]:
    """Map each LDM UNet module path of a layout to its diffusers path (paths without `.weight`)."""
    paths = sorted(set(module_paths))
    blocks: dict[tuple[str, int], dict[int, list[str]]] = {}
    for p in paths:
        m = re.match(r"^(input_blocks|output_blocks)\.(\d+)\.(\d+)(?:\.(.*))?$", p)
        if m:
            blocks.setdefault((m.group(1), int(m.group(2))), {}).setdefault(int(m.group(3)), []).append(
                m.group(4) or ""
            )

    # Block prefix (e.g. "input_blocks.4.1") -> (diffusers prefix, kind)
    prefix_map: dict[str, tuple[str, str]] = {}
    level, j, res_per_level = 0, 0, None
    for n in sorted(n for kind, n in blocks if kind == "input_blocks"):
        if n == 0:
            continue
        subs = blocks[("input_blocks", n)]
        if any(r == "op" or r.startswith("op.") for r in subs.get(0, [])):
            prefix_map[f"input_blocks.{n}.0.op"] = (f"down_blocks.{level}.downsamplers.0.conv", "plain")
            if res_per_level is None:
                res_per_level = j
            level, j = level + 1, 0
            continue
        prefix_map[f"input_blocks.{n}.0"] = (f"down_blocks.{level}.resnets.{j}", "resnet")
        if 1 in subs:
            prefix_map[f"input_blocks.{n}.1"] = (f"down_blocks.{level}.attentions.{j}", "plain")
        j += 1
    if res_per_level is None:
        res_per_level = j
    per_level = res_per_level + 1
    for n in sorted(n for kind, n in blocks if kind == "output_blocks"):
        lvl, jj = divmod(n, per_level)
        subs = blocks[("output_blocks", n)]
        prefix_map[f"output_blocks.{n}.0"] = (f"up_blocks.{lvl}.resnets.{jj}", "resnet")
        for s, rests in subs.items():
            if s == 0:
                continue
            if all(r == "conv" or r.startswith("conv.") for r in rests):
                prefix_map[f"output_blocks.{n}.{s}.conv"] = (f"up_blocks.{lvl}.upsamplers.0.conv", "plain")
            else:
                prefix_map[f"output_blocks.{n}.{s}"] = (f"up_blocks.{lvl}.attentions.{jj}", "plain")
    prefix_map["middle_block.0"] = ("mid_block.resnets.0", "resnet")
    prefix_map["middle_block.1"] = ("mid_block.attentions.0", "plain")
    prefix_map["middle_block.2"] = ("mid_block.resnets.1", "resnet")

    out: dict[str, str] = {}
    for p in paths:
        for ldm, diff in _TOP:
            if p == ldm:
                out[p] = diff
        if p in out:
            continue
        for ldm_prefix, (diff_prefix, kind) in prefix_map.items():
            if p == ldm_prefix:
                out[p] = diff_prefix
                break
            if p.startswith(ldm_prefix + "."):
                rest = p[len(ldm_prefix) + 1 :]
                inner = _resnet_inner(rest) if kind == "resnet" else rest
                if inner is not None:
                    out[p] = f"{diff_prefix}.{inner}"
                break
    return out


def diffusers_to_ldm(module_paths: Iterable[str]) -> dict[str, str]:
    """The inverse map for a diffusers-named UNet layout: diffusers path -> LDM path.

    Built structurally like `ldm_to_diffusers`: `num_res_blocks` is the resnet count of `down_blocks.0`;
    down level L's resnet j is input block 1 + L·(n+1) + j, its downsampler input block (L+1)·(n+1);
    up level L's resnet j is output block L·(n+1) + j, its upsampler the last sub-block of output block
    L·(n+1) + n (`.2` after an attention, else `.1`).
    """
    paths = sorted(set(module_paths))
    res = {int(m.group(1)) for p in paths if (m := re.match(r"^down_blocks\.0\.resnets\.(\d+)\.", p))}
    n = (max(res) + 1) if res else 2
    up_attn = {int(m.group(1)) for p in paths if (m := re.match(r"^up_blocks\.(\d+)\.attentions\.", p))}
    top = {d: ldm for ldm, d in _TOP}
    inner = {d: ldm for ldm, d in _RESNET}
    out: dict[str, str] = {}
    for p in paths:
        if p in top:
            out[p] = top[p]
            continue
        m = re.match(
            r"^(down_blocks|up_blocks)\.(\d+)\.(resnets|attentions|downsamplers|upsamplers)\.(\d+)(?:\.(.*))?$",
            p,
        )
        mid = re.match(r"^mid_block\.(resnets|attentions)\.(\d+)(?:\.(.*))?$", p)
        if m:
            side, lvl, kind, j, rest = (
                m.group(1),
                int(m.group(2)),
                m.group(3),
                int(m.group(4)),
                m.group(5) or "",
            )
            if side == "down_blocks":
                if kind == "downsamplers":
                    prefix, rest_kind = f"input_blocks.{(lvl + 1) * (n + 1)}.0.op", "plain"
                    rest = rest.removeprefix("conv").lstrip(".")
                else:
                    blk = 1 + lvl * (n + 1) + j
                    prefix, rest_kind = f"input_blocks.{blk}.{0 if kind == 'resnets' else 1}", kind
            else:
                if kind == "upsamplers":
                    sub = 2 if lvl in up_attn else 1
                    prefix, rest_kind = f"output_blocks.{lvl * (n + 1) + n}.{sub}.conv", "plain"
                    rest = rest.removeprefix("conv").lstrip(".")
                else:
                    blk = lvl * (n + 1) + j
                    prefix, rest_kind = f"output_blocks.{blk}.{0 if kind == 'resnets' else 1}", kind
        elif mid:
            kind, j, rest = mid.group(1), int(mid.group(2)), mid.group(3) or ""
            prefix, rest_kind = f"middle_block.{1 if kind == 'attentions' else 2 * j}", kind
        else:
            continue
        if rest_kind == "resnets" and rest:
            head, _, tail = rest.partition(".")
            if head not in inner:
                continue
            rest = inner[head] + ("." + tail if tail else "")
        out[p] = f"{prefix}.{rest}" if rest else prefix
    return out
