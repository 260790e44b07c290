"""Wan 2.1 and Wan 2.2 video transformers, in the original naming (Wan-Video/Wan2.1 and Wan2.2
`wan/modules/model.py`, which ComfyUI's repackaged files keep) and in diffusers naming
(`WanTransformer3DModel`, `WanVACETransformer3DModel`).

Facts (cited, not copied):
* Original: `blocks.N.self_attn.{q,k,v,o}` (dim x dim), `blocks.N.cross_attn.*`, `blocks.N.ffn.{0,2}`,
  `blocks.N.modulation` [1, 6, dim]; `patch_embedding` Conv3d [dim, in_dim, 1, 2, 2]; `head.head`
  [out_dim * 1*2*2, dim]. Image conditioning of Wan 2.1 (i2v, flf2v) adds `img_emb.proj.*` (an MLP from
  the 1280-wide CLIP image features) and `cross_attn.k_img / v_img` in every block; FLF2V adds
  `img_emb.emb_pos` (Wan2.1 `model.py`, `MLPProj`, `WanI2VCrossAttention`). Wan 2.2 dropped the CLIP
  image branch: its I2V A14B only widens `patch_embedding` (Wan2.2 `model.py`, `WanCrossAttention`).
* Configs (Wan2.1 / Wan2.2 `wan/configs/*.py`): T2V-1.3B dim 1536, ffn 8960, 30 layers; T2V-14B and
  I2V-14B dim 5120, ffn 13824, 40 layers; Wan 2.2 T2V-A14B and I2V-A14B: two experts (high / low noise)
  each with exactly the 14B config; TI2V-5B dim 3072, ffn 14336, 30 layers, on the 48-channel Wan 2.2
  VAE. VACE (`vace_model.py`): `vace_patch_embedding` and `vace_blocks.N.{before,after}_proj`.
* Input channels: i2v concatenates the image latent and a 4-channel mask (16 + 16 + 4 = 36); the Fun
  control models two latents (16 + 32 = 48, ComfyUI `WanFunControlToVideo`); Fun markers
  `control_adapter.conv` (camera) and `ref_conv` (reference image) from aigc-apps/VideoX-Fun
  `wan_transformer3d.py`; S2V `casual_audio_encoder` and Animate `face_adapter` / `motion_encoder` from
  ComfyUI `model_detection.py` and diffusers `convert_wan_transformer_to_diffusers`.
* diffusers renames (`convert_wan_transformer_to_diffusers`): self_attn -> attn1, cross_attn -> attn2,
  k_img -> add_k_proj, ffn.0 -> ffn.net.0.proj, head.head -> proj_out, modulation -> scale_shift_table,
  img_emb.proj -> condition_embedder.image_embedder, before/after_proj -> proj_in/out.
* Wan-Animate-2 (diffusers `WanAnimate2Transformer3DModel`, `convert_wan_animate_2_transformer_to_diffusers`): the
  14B blocks with the CLIP image branch, each wrapped in the release's in-context module (`blocks.N.block.self_attn.q`);
  diffusers drops the wrapper and renames only the attention's projections (`blocks.N.self_attn.to_q`, `add_k_proj`),
  keeping the original's `ffn.0`, `norm3`, `modulation`, `head.head` and `img_emb`. No Wan release has either.
"""

from __future__ import annotations

from .backbone import Backbone
from .keys import KeyIndex
from .view import View, find_view, variant

# dim -> (size, ffn_dim of that release, which Wan version ships it)
SIZES = {1536: ("1.3b", 8960, "wan21"), 5120: ("14b", 13824, None), 3072: ("5b", 14336, "wan22")}

_ORIGINAL = {
    "q": "blocks.#.self_attn.q.weight",
    "k_img": "blocks.#.cross_attn.k_img.weight",
    "ffn": "blocks.#.ffn.0.weight",
    "out": "head.head.weight",
    "img_emb": "img_emb.proj.1.weight",
    "flf": "img_emb.emb_pos",
    "vace": "vace_patch_embedding.weight",
    "vace_block": "vace_blocks.#.after_proj.weight",
}
_DIFFUSERS = {
    "q": "blocks.#.attn1.to_q.weight",
    "k_img": "blocks.#.attn2.add_k_proj.weight",
    "ffn": "blocks.#.ffn.net.0.proj.weight",
    "out": "proj_out.weight",
    "img_emb": "condition_embedder.image_embedder.ff.net.0.proj.weight",
    "flf": "condition_embedder.image_embedder.pos_embed",
    "vace": "vace_patch_embedding.weight",
    "vace_block": "vace_blocks.#.proj_out.weight",
}
# Wan-Animate-2: the release's wrapped blocks, and diffusers' names for them
_ANIMATE2_RELEASE = {
    "q": "blocks.#.block.self_attn.q.weight",
    "k_img": "blocks.#.block.cross_attn.k_img.weight",
    "ffn": "blocks.#.block.ffn.0.weight",
    "out": "head.head.weight",
}
_ANIMATE2_DIFFUSERS = {**_ANIMATE2_RELEASE, "q": "blocks.#.self_attn.to_q.weight",
                       "k_img": "blocks.#.cross_attn.add_k_proj.weight", "ffn": "blocks.#.ffn.0.weight"}  # fmt: skip


def wan(ix: KeyIndex) -> Backbone | None:
    names = _ORIGINAL
    v = find_view(ix, "blocks.#.self_attn.q.weight", "blocks.#.modulation")
    if v is None:
        names = _DIFFUSERS
        v = find_view(
            ix, "blocks.#.attn1.to_q.weight", "blocks.#.scale_shift_table", "blocks.#.attn2.to_k.weight"
        )
    if v is None:
        names = _ANIMATE2_RELEASE
        v = find_view(ix, "blocks.#.block.self_attn.q.weight", "blocks.#.block.modulation")
    if v is None:
        names = _ANIMATE2_DIFFUSERS
        v = find_view(ix, "blocks.#.self_attn.to_q.weight", "blocks.#.modulation", "blocks.#.ffn.0.weight")
    if v is None:
        return None
    b = Backbone(v.prefix, "transformer", "wan", prediction="flow")
    dim = v.dim(names["q"], 0)
    ffn = v.dim(names["ffn"], 0)
    k_img = v.key(names["k_img"])
    v.because(b, names["q"], f"Wan attention blocks ({v.blocks(names['q'])}), hidden size {dim}")
    size, want_ffn, version = SIZES.get(dim or 0, (None, None, None))
    if size is None or ffn != want_ffn:
        v.because(b, names["ffn"], f"hidden {dim}, feed-forward {ffn}: no known Wan release has this size")
    else:
        v.because(b, names["ffn"], f"hidden {dim}, feed-forward {ffn} → the {size.upper()} Wan configuration")

    if names is _ANIMATE2_RELEASE or names is _ANIMATE2_DIFFUSERS:
        task, version, also = _animate2(v, b, names)
    else:
        task, version, also = _task(v, b, names, dim, k_img, version)
    b.architecture = version or "wan21"
    also += _on_wan21(v, b, names["q"], task, size, version)
    b.also = also
    b.variant = variant(task, size)
    if task == "helios":  # Wan's blocks under another stem and head: no Wan release, none Loadout runs
        b.evidence.insert(0, b.evidence.pop())  # the marker's line (_task's last) says so first
        b.architecture, b.variant, b.also = None, None, []
    return b


def _task(v: View, b: Backbone, names: dict, dim, k_img, version):
    """(task, version, also) from the markers and the input channels."""
    patch = v.key("patch_embedding.weight")
    shape = v.ix.shape(patch) if patch else None
    in_dim = shape[1] if shape and len(shape) == 5 else None
    out = v.dim(names["out"], 0)
    latent = out // 4 if out else None  # head.head is out_dim x (1*2*2 patch)
    also: list[str] = []
    if k_img is not None:
        # Only Wan 2.1 conditions on CLIP image features (Wan 2.2's blocks have no image keys).
        v.because(
            b, names["k_img"], "image keys in every cross-attention (CLIP image conditioning) → Wan 2.1"
        )
        version = "wan21"
    if latent == 48:
        v.because(b, names["out"], "48 output channels: the Wan 2.2 VAE's latent → Wan 2.2")
        version = "wan22"
    for marker, ver, task, why in (
        (
            "casual_audio_encoder.encoder.final_linear.weight",
            "wan22",
            "s2v",
            "an audio encoder → Wan 2.2 S2V",
        ),
        ("face_adapter.fuser_blocks.0.k_norm.weight", "wan22", "animate", "a face adapter → Wan 2.2 Animate"),
        ("motion_encoder.motion_synthesis_weight", "wan22", "animate", "a motion encoder → Wan 2.2 Animate"),
        ("motion_encoder.dec.direction.weight", "wan22", "animate", "a motion encoder → Wan 2.2 Animate"),
        # diffusers `transformer_anyflow_far.py` / `transformer_anyflow.py`: Wan 2.1's blocks, a second
        # timestep embedder (the flow map's target time), FAR's patch embedding for context frames
        (
            "far_patch_embedding.weight",
            version,
            "anyflow_far",
            "a second patch embedding for compressed context frames → AnyFlow FAR (autoregressive)",
        ),
        (
            "condition_embedder.delta_embedder.linear_1.weight",
            version,
            "anyflow",
            "a second timestep embedding (the flow map's target time) → AnyFlow, Wan 2.1 for any-step sampling",
        ),
        # SkyReels-V2 with sample-info injection (SkyworkAI/SkyReels-V2 `transformer.py`; diffusers
        # transformer_skyreels_v2.py, `inject_sample_info`): an fps embedding added to the time modulation
        (
            "fps_embedding.weight",
            version,
            "skyreels_v2",
            "an fps embedding beside the timestep's → SkyReels-V2",
        ),
        # diffusers `transformer_helios.py`: history latents patched at three scales, its own output norm
        (
            "patch_long.weight",
            None,
            "helios",
            "patch embeddings of short / mid / long history → Helios: a release Loadout does not run",
        ),
    ):
        if v.has(marker):
            v.because(b, marker, why)
            return task, ver, also
    if v.has(names["vace"]) or v.has(names["vace_block"]):
        key = names["vace"] if v.has(names["vace"]) else names["vace_block"]
        v.because(b, key, "VACE context blocks beside the main blocks → VACE (all-in-one editing)")
        if version is None and dim == 5120:
            also = _shared(v, b, key, "Wan 2.1 VACE 14B and Wan 2.2 VACE-Fun A14B")
        return "vace", version, also
    for marker, why in (
        ("control_adapter.conv.weight", "a camera-control adapter → Wan Fun (Control-Camera)"),
        ("ref_conv.weight", "a reference-image convolution → Wan Fun (Control with reference)"),
    ):
        if v.has(marker):
            v.because(b, marker, why)
            if version is None and dim == 5120:
                # ComfyUI tells the 2.2 camera model by the missing CLIP branch (model_detection.py)
                version = "wan22"
                v.because(b, marker, "… without CLIP image conditioning → the Wan 2.2 Fun release")
            return "fun", version, also
    if v.has(names["flf"]):
        v.because(b, names["flf"], "position embeddings for two CLIP images → first-last-frame (FLF2V)")
        return "flf2v", version or "wan21", also
    if in_dim is None or latent is None:
        why = "no patch embedding or output head in this file (a shard?): t2v / i2v cannot be told"
        b.because(v.ix, v.prefix + "patch_embedding.weight", why)
        if version is None and dim == 5120:
            also = _shared(v, b, names["q"], "Wan 2.1 14B and the Wan 2.2 A14B experts")
        return ("i2v" if k_img else None), version, also
    extra = in_dim - latent
    why = f"{in_dim} input channels = {latent} latent"
    if extra == 0:
        task = "ti2v" if dim == 3072 else "t2v"
        v.because(b, "patch_embedding.weight", why + " only → " + task)
        if version is None and dim == 5120:
            also = _shared(v, b, "patch_embedding.weight", "Wan 2.1 T2V 14B and each Wan 2.2 T2V A14B expert")
        return task, version, also
    if extra == latent + 4:
        v.because(b, "patch_embedding.weight", why + f" + {latent} image latent + 4 mask → image-to-video")
        if version is None and dim == 5120:
            v.because(b, "patch_embedding.weight", "image input without CLIP image keys → Wan 2.2 I2V A14B")
            version = "wan22"
        if dim in (1536, 3072):  # Wan ships no 1.3B i2v and its 5B is ti2v: these are the Fun InP models
            v.because(b, "patch_embedding.weight", "an inpainting input at this size → Wan Fun InP")
            return "fun", version, also
        return "i2v", version, also
    if extra == 2 * latent:
        v.because(
            b,
            "patch_embedding.weight",
            why + f" + {latent} control + {latent} image latents → Wan Fun Control",
        )
        return "fun", version, also
    v.because(b, "patch_embedding.weight", why + f" + {extra} more: no known Wan release takes this input")
    return None, version, also


def _animate2(v: View, b: Backbone, names: dict):
    """Wan-Animate-2, told by its blocks alone (each shard holds them): neither Wan's original nor diffusers' naming."""
    why = (
        "each Wan block wrapped in an in-context module (blocks.N.block.…)"
        if names is _ANIMATE2_RELEASE
        else "Wan blocks with diffusers' attention names beside the original's ffn / modulation"
        " (WanAnimate2Transformer3DModel's layout)"
    )
    v.because(b, names["q"], why + " → Wan-Animate-2 (in-context attention over a driving video's K/V)")
    return "animate2", "wan22", []


def _on_wan21(
    v: View, b: Backbone, q: str, task: str | None, size: str | None, version: str | None
) -> list[str]:
    """Releases built on Wan 2.1's modules with nothing of their own in the file: diffusers' SkyReels-V2
    (transformer_skyreels_v2.py, Skywork's T2V / I2V / DF at 1.3B and 14B) and ChronoEdit (transformer_chronoedit.py,
    nvidia's ChronoEdit-14B, from Wan 2.1 I2V 14B: CLIP image keys, 36 input channels) hold Wan's modules key for
    key, and diffusers reads their single files with the Wan converter (loaders/single_file_model.py maps both
    classes to convert_wan_transformer_to_diffusers). SkyReels-V2's fps conditioning is a marker of _task."""
    if version == "wan22" or task not in ("t2v", "i2v") or size not in ("1.3b", "14b"):
        return []
    also = ["skyreels_v2"] + (["chronoedit"] if task == "i2v" and size == "14b" else [])
    names = "SkyReels-V2" + (" and ChronoEdit" if len(also) == 2 else "")
    v.because(b, q, f"{names} hold Wan 2.1's modules key for key: the header cannot tell them apart")
    return also


def _shared(v: View, b: Backbone, suffix: str, releases: str) -> list[str]:
    v.because(b, suffix, f"{releases} share this layout key for key: the header cannot tell them apart")
    return ["wan22"]
