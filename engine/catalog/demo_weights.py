"""Small dense files in real formats for the demo library: a kohya LoRA and a LyCORIS LoHa for SD1 and
a textual-inversion embedding for SDXL — random but deterministic values, real key names and shapes.
(The embedding's and the TAESD pair's keys and shapes come from demo_layouts.)

Facts used (learned from the projects, not copied):
* kohya sd-scripts LoRA for SD1: modules of the diffusers UNet's Transformer2DModel blocks (proj_in /
  proj_out are 1×1 convs in SD1, attn1/attn2 to_q/k/v/out.0, ff.net.0.proj (GEGLU, 8c), ff.net.2) and
  of CLIP-L's attention and MLP, named `lora_unet_` / `lora_te_` + the module path with `.` → `_`;
  tensors `lora_down.weight` (r, in[,1,1]), `lora_up.weight` (out, r[,1,1]) and a scalar `alpha`.
* LyCORIS LoHa: `hada_w1_a` (out, r), `hada_w1_b` (r, in), `hada_w2_a`, `hada_w2_b`, `alpha`; with
  kohya module names as LyCORIS writes them (see the real LoKr in ../shared/data).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from . import demo_layouts

SD1_CONTEXT = 768
CLIP_L_WIDTH, CLIP_L_LAYERS = 768, 12


def sd1_lora_modules(*, attention_only: bool = False) -> list[tuple[str, int, int, bool]]:
    """(kohya module name, in, out, is 1×1 conv) for the modules kohya's LoRA trains on SD1."""
    blocks = []  # (diffusers path of a Transformer2DModel, channels)
    for i, c in enumerate((320, 640, 1280)):
        blocks += [(f"down_blocks.{i}.attentions.{j}", c) for j in range(2)]
    blocks.append(("mid_block.attentions.0", 1280))
    for i, c in zip((1, 2, 3), (1280, 640, 320), strict=True):
        blocks += [(f"up_blocks.{i}.attentions.{j}", c) for j in range(3)]
    mods: list[tuple[str, int, int, bool]] = []
    for path, c in blocks:
        t = f"{path}.transformer_blocks.0"
        if not attention_only:
            mods.append((f"{path}.proj_in", c, c, True))
        for a in ("attn1", "attn2"):
            ctx = c if a == "attn1" else SD1_CONTEXT
            mods += [(f"{t}.{a}.to_q", c, c, False), (f"{t}.{a}.to_k", ctx, c, False)]
            mods += [(f"{t}.{a}.to_v", ctx, c, False), (f"{t}.{a}.to_out.0", c, c, False)]
        if not attention_only:
            mods += [(f"{t}.ff.net.0.proj", c, 8 * c, False), (f"{t}.ff.net.2", 4 * c, c, False)]
            mods.append((f"{path}.proj_out", c, c, True))
    out = [("lora_unet_" + p.replace(".", "_"), i, o, conv) for p, i, o, conv in mods]
    w = CLIP_L_WIDTH
    for n in range(CLIP_L_LAYERS):
        base = f"lora_te_text_model_encoder_layers_{n}_"
        out += [(f"{base}self_attn_{p}_proj", w, w, False) for p in ("q", "k", "v", "out")]
        if not attention_only:
            out += [(f"{base}mlp_fc1", w, 4 * w, False), (f"{base}mlp_fc2", 4 * w, w, False)]
    return out


def _kohya_metadata(name: str, module: str, dim: int, alpha: float, args: dict | None, tags: dict) -> dict:
    meta = {
        "ss_output_name": name,
        "ss_network_module": module,
        "ss_network_dim": str(dim),
        "ss_network_alpha": str(alpha),
        "ss_base_model_version": "sd_v1",
        "ss_v2": "False",
        "ss_resolution": "(512, 512)",
        "ss_num_epochs": "10",
        "ss_steps": "1500",
        "ss_tag_frequency": json.dumps({"demo": tags}),
        "ss_training_comment": "Loadout demo file: random weights, real key layout.",
        "modelspec.architecture": "stable-diffusion-v1/lora",
        "modelspec.title": name,
    }
    if args:
        meta["ss_network_args"] = json.dumps(args)
    return meta


def write_kohya_lora(path: str | Path, *, rank: int = 2, alpha: float = 1.0, seed: int = 1) -> Path:
    """A kohya-format SD1 LoRA over every module kohya trains (UNet attention blocks + CLIP-L)."""
    import torch

    from ..formats.safetensors import save_tensors

    g = torch.Generator().manual_seed(seed)
    t: dict = {}
    for name, i, o, conv in sd1_lora_modules():
        k = (1, 1) if conv else ()
        t[f"{name}.lora_down.weight"] = (torch.randn((rank, i, *k), generator=g) / math.sqrt(i)).half()
        t[f"{name}.lora_up.weight"] = (torch.randn((o, rank, *k), generator=g) * 0.02).half()
        t[f"{name}.alpha"] = torch.tensor(alpha, dtype=torch.float16)
    tags = {"demo style": 40, "soft light": 25, "painting": 12}
    meta = _kohya_metadata(Path(path).stem, "networks.lora", rank, alpha, None, tags)
    return save_tensors(path, t, meta)


def write_loha(path: str | Path, *, rank: int = 2, alpha: float = 1.0, seed: int = 2) -> Path:
    """A LyCORIS LoHa for SD1 on the UNet's and CLIP-L's attention projections (the 'attn-only' preset)."""
    import torch

    from ..formats.safetensors import save_tensors

    g = torch.Generator().manual_seed(seed)
    t: dict = {}
    for name, i, o, _conv in sd1_lora_modules(attention_only=True):
        for w in ("w1", "w2"):
            t[f"{name}.hada_{w}_a"] = (torch.randn((o, rank), generator=g) * 0.1).half()
            t[f"{name}.hada_{w}_b"] = (torch.randn((rank, i), generator=g) / math.sqrt(i)).half()
        t[f"{name}.alpha"] = torch.tensor(alpha, dtype=torch.float16)
    args = {"algo": "loha", "preset": "attn-only"}
    meta = _kohya_metadata(Path(path).stem, "lycoris.kohya", rank, alpha, args, {"fine detail": 30})
    return save_tensors(path, t, meta)


def write_embedding(path: str | Path, *, seed: int = 8) -> Path:
    """The SDXL textual-inversion embedding (`clip_g`, `clip_l`, 4 vectors each): normal values scaled by
    1/sqrt(fan-in), like an initialised layer, drawn in file order from one seeded generator."""
    import torch

    from ..formats.dtypes import torch_dtype
    from ..formats.safetensors import save_tensors

    g = torch.Generator().manual_seed(seed)
    t: dict = {}
    for key, dt, shape in demo_layouts.rows("embedding_sdxl"):
        fan_in = math.prod(shape[1:]) if len(shape) > 1 else 1
        t[key] = (torch.randn(shape, generator=g) * (1.0 / math.sqrt(fan_in))).to(torch_dtype(dt))
    return save_tensors(path, t)
