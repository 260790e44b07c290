"""Small-file kinds told by their own key vocabulary: LoRA, embeddings, ControlNet, IP-Adapter, upscalers.

Facts (cited, not copied):
* LoRA / LyCORIS suffixes: kohya sd-scripts `networks/lora.py` (`lora_down`, `lora_up`, `alpha`, module
  names `lora_unet_*`, `lora_te*_`), LyCORIS `lycoris/modules` (`hada_w1_a`…, `lokr_w1`…, `oft_blocks`,
  `on_input`, `dora_scale`, full `diff`/`diff_b`), PEFT (`lora_A`/`lora_B`), diffusers (`lora.down`/`lora.up`,
  `lora_linear_layer`). The LoRA facts themselves come from `engine.lora.describe_lora`.
* Textual inversion: A1111 `modules/textual_inversion` (`string_to_param` dict with `*`, safetensors
  `emb_params`), SDXL embeddings with one tensor per encoder named `clip_l` / `clip_g`.
* ControlNet: lllyasviel ControlNet `cldm` (`input_hint_block`, `zero_convs`, under `control_model.` in
  full checkpoints), diffusers ControlNetModel (`controlnet_cond_embedding`, `controlnet_down_blocks`),
  diffusers CHECKPOINT_KEY_NAMES["controlnet"].
* IP-Adapter (tencent-ailab/IP-Adapter): `image_proj.*` and `ip_adapter.N.to_k_ip/to_v_ip`, where to_k_ip
  maps the UNet's cross-attention context width (768 SD1, 1024 SD2, 2048 SDXL) to the block width.
* ESRGAN-family upscalers: the key sets chaiNNer's spandrel uses (`architectures/ESRGAN`): old
  `model.0.weight` + `model.1.sub.0.RDB1.conv1.0.weight`, new `conv_first` + `RRDB_trunk.0.RDB1.conv1`,
  BasicSR `conv_first` + `body.0.rdb1.conv1` + `conv_body` + `conv_last`.
"""

from __future__ import annotations

import re

from .keys import KeyIndex
from .result import Evidence

_STRONG = (
    *(
        f".{n}.weight"
        for n in ("lora_down", "lora_up", "lora_A", "lora_B", "lora_mid", "lora.down", "lora.up")
    ),
    ".lora_linear_layer.down.weight",
    ".lora_linear_layer.up.weight",
    *(f".hada_w{i}_{ab}" for i in (1, 2) for ab in "ab"),
    ".hada_t1",
    ".hada_t2",
    ".lokr_w1",
    ".lokr_w2",
    *(f".lokr_w{i}_{ab}" for i in (1, 2) for ab in "ab"),
    ".lokr_t2",
    ".oft_blocks",
    ".oft_diag",
    ".oft_R",
    ".on_input",  # (IA)³'s flag (LyCORIS `modules/ia3.py`); no model names a tensor so
)
_STRONG_NAMED = re.compile(r".*\.lora_(?:A|B)\.[A-Za-z0-9_]+\.weight$")  # PEFT with an adapter name
# XLabs FLUX LoRAs (x-flux `LoRALinearLayer` inside attention processors).
_XLABS = re.compile(r".*\.processor\.(?:qkv|proj)_lora[12]?\.(?:up|down)\.weight$")
_WEAK = (".alpha", ".dora_scale", ".diff", ".diff_b", ".w_norm", ".b_norm")
_KOHYA = ("lora_unet_", "lora_te_", "lora_te1_", "lora_te2_", "lora_te3_", "lora_transformer_", "lycoris_")


_WEAK_OR_STRONG = _WEAK + _STRONG


def _strong(k: str) -> bool:
    return (
        k.endswith(_STRONG)
        or (".lora_" in k and _STRONG_NAMED.match(k) is not None)
        or ("_lora" in k and _XLABS.match(k) is not None)
    )


CONTEXT_ARCH = {768: "sd1", 1024: "sd2", 2048: "sdxl", 1280: "sdxl_refiner"}


def _ev(ix: KeyIndex, key: str, reason: str) -> Evidence:
    return Evidence(key, ix.shape(key), reason)


def lora_evidence(ix: KeyIndex) -> Evidence | None:
    """Evidence that this is an adapter file, or None. Most keys must be adapter keys."""
    keys = list(ix.tensors)
    # Most keys of an adapter file name one (kohya `lora_unet_…`, PEFT `lora_A`, diffusers `.lora.down`):
    # when few keys could, count the most that can pass the tests below from the head groups and the
    # suffix index, which a model's detection builds anyway — a checkpoint is told apart in a few
    # lookups instead of a test on half its keys (the most frequent answer of a library scan).
    named = ix.text.count("lora")
    if named * 2 < len(keys):
        kohya = sum(len(group) for head, group in ix.heads.items() if head.startswith(_KOHYA))
        if (kohya + ix.count_ending(_WEAK_OR_STRONG) + named) * 2 < len(keys):
            return None
    adapterish = []
    allowed = len(keys) // 2  # more keys than this that are no adapter's: a model, stop looking
    for k in keys:  # the cheap tests first: most keys of a model fail all of them
        if k.startswith(_KOHYA) or k.endswith(_WEAK_OR_STRONG) or ("lora" in k and _strong(k)):
            adapterish.append(k)
        else:
            allowed -= 1
            if allowed < 0:
                return None
    if not keys or len(adapterish) * 2 < len(keys):
        return None
    # _strong inlined for the common case (a plain suffix): one call per key cost a LoRA 0.1 ms
    strong = [
        k for k in adapterish if k.endswith(_STRONG) or ((".lora_" in k or "_lora" in k) and _strong(k))
    ]
    if strong:
        k = min(strong)
        tail = k.split(".")[-2] if k.endswith(".weight") else k.split(".")[-1]
        return _ev(ix, k, f"{len(strong)} adapter tensors such as `{tail}` → LoRA / LyCORIS")
    kohya = [k for k in keys if k.startswith(_KOHYA)]
    if kohya:
        k = min(kohya)
        if any(key.endswith((".diff", ".diff_b")) for key in kohya):
            return _ev(ix, k, "kohya module names with weight differences only → full-diff LoRA")
        return _ev(ix, k, "adapter parts under kohya / LyCORIS module names → LoRA / LyCORIS")
    # Weight and bias differences only, under the model's own module names (ComfyUI's and
    # lightx2v's `.diff` / `.diff_b`): no checkpoint names a tensor so.
    diffs = [k for k in keys if k.endswith((".diff", ".diff_b"))]
    if diffs and len(diffs) * 2 >= len(keys):
        k = min(diffs)
        return _ev(ix, k, f"{len(diffs)} weight/bias differences (`.diff`, `.diff_b`) → full-diff LoRA")
    return None


def embedding(ix: KeyIndex) -> tuple[str | None, list[Evidence]] | None:
    """(architecture, evidence) when the file is a textual-inversion embedding."""
    if ix.has("clip_l") and ix.has("clip_g") and len(ix.tensors) <= 3:
        return "sdxl", [
            _ev(ix, "clip_l", "one embedding per SDXL text encoder (clip_l)"),
            _ev(ix, "clip_g", "… and clip_g → SDXL textual inversion"),
        ]
    key = next((k for k in ("emb_params", "string_to_param.*") if ix.has(k)), None)
    if key is None:
        key = next(iter(ix.with_prefix("string_to_param.")), None)
    if key is None and len(ix.tensors) == 1:
        # diffusers textual inversion (learned_embeds): one tensor named after its token, e.g. "<cat-toy>"
        k, t = next(iter(ix.tensors.items()))
        if k.startswith("<") and k.endswith(">") and len(t.shape) in (1, 2) and t.shape[-1] in (768, 1024):
            key = k
    if key is None:
        return None
    width = (ix.shape(key) or (0,))[-1]
    arch = {768: "sd1", 1024: "sd2"}.get(width)
    name = {"sd1": "SD1 (CLIP-L)", "sd2": "SD2 (OpenCLIP-H)"}.get(arch, "an unknown text encoder")
    n = (ix.shape(key) or (1,))[0] if len(ix.shape(key) or ()) == 2 else 1
    return arch, [_ev(ix, key, f"textual-inversion vectors ({n} × {width}) → {name}")]


def controlnet(ix: KeyIndex) -> tuple[str | None, list[Evidence], list[tuple[str, str]]] | None:
    """(architecture, evidence, component claims) for a ControlNet: a trainable copy of the UNet's
    encoder (component `unet`, under its own prefix) or of a DiT's blocks (`transformer`)."""
    p = next(
        (p for p in ix.prefixes_for("input_hint_block.0.weight") if ix.has(p + "zero_convs.0.0.weight")), None
    )
    if p is not None:
        first = p + "input_hint_block.0.weight"
        ctx_key = ix.first_match(
            re.escape(p) + r"input_blocks\.\d+\.1\.transformer_blocks\.0\.attn2\.to_k\.weight"
        )
        adm_key = p + "label_emb.0.0.weight"
    else:
        # diffusers ControlNetModel's hint encoder, or SparseCtrl's one convolution (diffusers
        # `controlnet_sparsectrl.py`, `use_simplified_condition_embedding`)
        # (looked up from the three-segment key: prefixes_for a two-segment one reads every key)
        first = next(
            (
                p + suffix
                for p in ix.prefixes_for("controlnet_down_blocks.0.weight")
                for suffix in ("controlnet_cond_embedding.conv_in.weight", "controlnet_cond_embedding.weight")
                if ix.has(p + suffix)
            ),
            None,
        )
        if first is None:
            return _t2i_adapter(ix) or _dit_controlnet(ix)
        p = first[: first.index("controlnet_cond_embedding.")]
        ctx_key = ix.first_match(
            re.escape(p) + r"down_blocks\.\d+\.attentions\.0\.transformer_blocks\.0\.attn2\.to_k\.weight"
        )
        adm_key = p + "add_embedding.linear_1.weight"
    ev = [_ev(ix, first, "a hint encoder with zero-initialised output convolutions → ControlNet")]
    motion = next((k for k in ix.with_prefix(p + "down_blocks.") if ".motion_modules." in k), None)
    if motion is not None:
        ev.append(_ev(ix, motion, "motion modules in its blocks → SparseCtrl (for AnimateDiff)"))
    ctx = ix.dim(ctx_key, 1)
    adm = ix.dim(adm_key, 1)
    arch = CONTEXT_ARCH.get(ctx) if ctx else None
    if arch == "sdxl_refiner":
        arch = None
    if ctx:
        ev.append(_ev(ix, ctx_key, f"cross-attention context {ctx} → {arch or 'unknown family'}"))
    elif adm == 2816:
        arch = "sdxl"
        ev.append(_ev(ix, adm_key, "pooled + size conditioning 2816 (no attention blocks) → SDXL"))
    return arch, ev, [(p, "unet")]


# T2I-Adapter (TencentARC T2I-Adapter `ldm/modules/encoders/adapter.py`: `conv_in`, `body.N.block1/2`,
# the light adapter's `body.N.body.M.block1`; diffusers `T2IAdapter`: the same under `adapter.` with
# `resnets`): a small convolutional encoder of the pixel-unshuffled hint, no copy of the UNet. Its first
# convolution takes the hint's channels times the unshuffle factor squared: 8 for SD1.5 / SD2, 16 for
# the SDXL adapters (diffusers `FullAdapterXL`, `downscale_factor` 16 in TencentARC's SDXL configs).
_T2I_BLOCKS = ("body.0.resnets.0.block1.weight", "body.0.block1.weight", "body.0.body.0.block1.weight")


def _t2i_adapter(ix: KeyIndex) -> tuple[str | None, list[Evidence], list[tuple[str, str]]] | None:
    for prefix in ("adapter.", ""):
        block = next((prefix + b for b in _T2I_BLOCKS if ix.has(prefix + b)), None)
        if block is None or not ix.has(block.replace("block1", "block2")):
            continue
        first = next(
            (prefix + k for k in ("conv_in.weight", "body.0.in_conv.weight") if ix.has(prefix + k)), None
        )
        if first is None:
            continue
        ev = [_ev(ix, block, "residual blocks over a pixel-unshuffled hint, no UNet copy → T2I-Adapter")]
        hint = ix.dim(first, 1) or 0
        factor = next((f for f in (8, 16) for c in (1, 3) if hint == c * f * f), None)
        arch = "sdxl" if factor == 16 else None
        if factor is not None:
            to = "SDXL (its adapters unshuffle by 16)" if arch else "SD1.5 / SD2 (both unshuffle by 8)"
            ev.append(_ev(ix, first, f"{hint} input channels: the hint unshuffled by {factor} → {to}"))
        return arch, ev, [("", "other")]
    return None


def _dit_controlnet(ix: KeyIndex) -> tuple[str | None, list[Evidence], list[tuple[str, str]]] | None:
    # diffusers `controlnet_cosmos.py`: Cosmos Transfer's control blocks, each with an after_proj
    key = (
        ix.first_match(r"control_blocks\.\d+\.after_proj\.weight")
        if ix.has_prefix("control_blocks.0.")
        else None
    )
    if key is not None:
        return (
            None,
            [_ev(ix, key, "control blocks over Cosmos blocks → Cosmos Transfer (a ControlNet)")],
            [("", "transformer")],
        )
    if not ix.has_prefix("controlnet_blocks.0."):
        return None
    claims = [("", "transformer")]
    if ix.has("controlnet_x_embedder.weight"):
        qwen = ix.first_match(r"transformer_blocks\.\d+\.img_mod\.1\.weight")
        if qwen is not None:  # diffusers `controlnet_qwenimage.py`: Qwen-Image's dual-stream blocks
            return None, [_ev(ix, qwen, "ControlNet blocks over Qwen-Image's dual-stream blocks")], claims
        why = "ControlNet blocks over FLUX.1 double/single blocks"
        return None, [_ev(ix, "controlnet_x_embedder.weight", why)], claims
    if ix.has("pos_embed_input.proj.weight"):
        return (
            None,
            [_ev(ix, "pos_embed_input.proj.weight", "ControlNet blocks over SD3 joint blocks")],
            claims,
        )
    k = min(ix.with_prefix("controlnet_blocks.0."))
    return None, [_ev(ix, k, "ControlNet output blocks on a transformer")], claims


def ip_adapter(ix: KeyIndex) -> tuple[str | None, list[Evidence]] | None:
    # XLabs' FLUX.1 IP-Adapter: ip_adapter_double_stream_k/v_proj inside each double block.
    flux_ip = ix.first_match(r"double_blocks\.\d+\.processor\.ip_adapter_double_stream_k_proj\.weight")
    if flux_ip is not None:
        return None, [
            _ev(ix, flux_ip, "image key/value projections in the double blocks → FLUX.1 IP-Adapter")
        ]
    if not ix.has_prefix("image_proj."):
        return None
    if not ix.has_prefix("ip_adapter."):
        return None
    key = ix.first_match(r"ip_adapter\.\d+\.to_k_ip\.weight")
    ev = [
        _ev(
            ix,
            min(ix.with_prefix("image_proj.")),
            "an image projection and per-attention ip_adapter layers → IP-Adapter",
        )
    ]
    if key is None:
        return None, ev
    ctx = ix.dim(key, 1)
    arch = CONTEXT_ARCH.get(ctx)
    if arch == "sdxl_refiner":
        arch = None
    ev.append(_ev(ix, key, f"image keys projected from context {ctx} → {arch or 'unknown family'}"))
    return arch, ev


_ESRGAN = (
    ("model.0.weight", "model.1.sub.0.RDB1.conv1.0.weight"),
    ("conv_first.weight", "body.0.rdb1.conv1.weight", "conv_body.weight", "conv_last.weight"),
    ("conv_first.weight", "RRDB_trunk.0.RDB1.conv1.weight", "trunk_conv.weight", "conv_last.weight"),
    ("model.0.weight", "model.1.sub.0.RDB1.conv1x1.weight"),
)


def motion_modules(ix: KeyIndex) -> list[Evidence] | None:
    """AnimateDiff's motion modules alone (guoyww/AnimateDiff `mm_sd_v15*.ckpt`: `down_blocks.N.motion_modules.M
    .temporal_transformer.*`; diffusers `MotionAdapter`: `down_blocks.N.motion_modules.M.*`): temporal
    layers for an image UNet's levels, no model of their own. SD1.5's UNet has four levels, SDXL's three
    (diffusers `MotionAdapter.block_out_channels`)."""
    keys = [k for k in ix.tensors if ".motion_modules." in k]
    if not keys or len(keys) * 2 < len(ix.tensors):
        return None
    levels = {int(m.group(1)) for k in keys if (m := re.match(r"down_blocks\.(\d+)\.", k))}
    base = {4: "SD1.5's UNet (four levels)", 3: "SDXL's UNet (three levels)"}.get(len(levels), "a UNet")
    why = f"AnimateDiff motion modules for {base}: temporal layers added to a model, which Loadout does not load"
    return [_ev(ix, min(keys), why)]


def redux(ix: KeyIndex) -> list[Evidence] | None:
    """FLUX.1 Redux (black-forest-labs `flux1-redux-dev.safetensors`; diffusers `ReduxImageEncoder`):
    two linears that carry SigLIP image features (1152 wide) into FLUX.1's T5 token space (4096), the
    image tokens ComfyUI's style-model node appends to the prompt."""
    if not (ix.has("redux_up.weight") and ix.has("redux_down.weight")) or len(ix.tensors) > 8:
        return None
    width = ix.dim("redux_up.weight", 1)
    out = ix.dim("redux_down.weight", 0)
    why = f"a projection of {width}-wide image features to {out}-wide text tokens → FLUX.1 Redux, a style model Loadout does not load"
    return [_ev(ix, "redux_up.weight", why)]


def upscaler(ix: KeyIndex) -> list[Evidence] | None:
    """ESRGAN-family (RRDBNet) upscalers, also under a wrapper such as BasicSR's `params_ema.`."""
    for keys in _ESRGAN:
        for p in ix.prefixes_for(keys[1]):
            if all(ix.has(p + k) for k in keys):
                return [
                    _ev(ix, p + keys[1], "residual-in-residual dense blocks (RRDB) → ESRGAN-family upscaler")
                ]
    return None
