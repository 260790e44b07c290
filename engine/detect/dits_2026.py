"""2026 image and video transformers Loadout detects with no forward pass, each from modules no other family
has, in diffusers' naming (what their releases ship; diffusers has no single-file converter for them).

Facts (cited, not copied; diffusers 0.42 classes, built on the meta device by the tests; every pipeline named
samples with FlowMatchEulerDiscreteScheduler, SANA-Video's also with DPMSolverMultistepScheduler over flow):
* NucleusMoE-Image (transformer_nucleusmoe_image.py): Qwen-Image-like `img_mod` blocks whose image MLP is a
  mixture of experts, a router `img_mlp.gate` [experts, hidden] beside a `shared_expert`, and a per-block
  `encoder_proj` for the text.
* PRX (Photoroom, transformer_prx.py): `blocks.N.attention.img_qkv_proj` (fused image q / k / v) and
  `txt_kv_proj` (text keys and values only), SwiGLU `gate_proj` / `up_proj` / `down_proj`.
* Ideogram 4 (transformer_ideogram4.py): `layers.N` with split `attention.to_q`, sandwich norms
  (`attention_norm1/2`, `ffn_norm1/2`) and one `adaln_modulation` linear per layer; Lumina 2's NextDiT has the
  norms too but a fused `attention.qkv` and `adaLN_modulation.1` (nextdit.py).
* GLM-Image (transformer_glm_image.py): CogView-style `transformer_blocks.N.attn1` under a stem of its own:
  `prior_token_embedding` (the autoregressive prior's image tokens), `glyph_projector`, `time_condition_embed`.
* JoyImage Edit and Edit Plus (transformer_joyimage.py, transformer_joyimage_edit_plus.py; jdopensource/JoyAI-Image-
  Edit and -Edit-Plus): HunyuanVideo-style `double_blocks.N` whose attention sits in one `attn` module
  (`attn.img_attn_qkv`, `attn.txt_attn_qkv`) and whose MLPs are diffusers' FeedForward (`img_mlp.net.0.proj`);
  the two classes build the same modules key for key.
* Bria FIBO 2 (transformer_bria_fibo2.py, briaai/Fibo-2.0-dev): NextDiT-style `layers.N` and `noise_refiner.N`
  behind a perceiver over the text (`perceiver.layers.N.cross_attention`), which no NextDiT release has.
* SANA-WM (transformer_sana_wm.py, Efficient-Large-Model/SANA-WM): Sana's original-named blocks with camera
  conditioning in every block (`blocks.N.plucker_proj`, `attn.q_proj_cam`) and a temporal convolution
  (`mlp.t_conv`).
* Cosmos 3 (transformer_cosmos3.py Cosmos3OmniTransformer): a language model's `layers.N` (`self_attn`, `mlp`,
  `input_layernorm`) with a second, generation pathway in every layer (`mlp_moe_gen`, `self_attn.add_q_proj`,
  `input_layernorm_moe_gen`); its outputs are velocities (flow matching). Cosmos Predict2 (video_dits.py) is a
  different network.
* SANA-Video (transformer_sana_video.py): Sana's linear-attention blocks with a temporal convolution in the
  Mix-FFN (`ff.conv_temp`) and a 3-D patch embedding; the original release names them as Sana's with the convolution
  `mlp.t_conv` (diffusers' convert_sana_video_to_diffusers.py), as SANA-WM's blocks do beside their camera modules.
"""

from __future__ import annotations

from .backbone import Backbone
from .keys import KeyIndex
from .view import View, find_view


def _backbone(v: View, arch: str, key: str, why: str) -> Backbone:
    b = Backbone(v.prefix, "transformer", arch, architecture=arch, prediction="flow")
    v.because(b, key, why)
    return b


def nucleus_image(ix: KeyIndex) -> Backbone | None:
    gate, q = "transformer_blocks.#.img_mlp.gate.weight", "transformer_blocks.#.attn.to_q.weight"
    v = find_view(ix, gate, "transformer_blocks.#.img_mlp.shared_expert.net.0.proj.weight", q)
    if v is None:
        return None
    why = (
        f"blocks with a mixture-of-experts image MLP ({v.dim(gate, 0)} experts and a shared one; {v.blocks(q)}),"
        f" hidden {v.dim(q, 1)} → NucleusMoE-Image"
    )
    return _backbone(v, "nucleus_image", gate, why)


def prx(ix: KeyIndex) -> Backbone | None:
    qkv = "blocks.#.attention.img_qkv_proj.weight"
    v = find_view(ix, qkv, "blocks.#.attention.txt_kv_proj.weight")
    if v is None:
        return None
    why = f"blocks with fused image q / k / v and text keys / values only ({v.blocks(qkv)}), hidden {v.dim(qkv, 1)} → PRX"
    return _backbone(v, "prx", qkv, why)


def ideogram4(ix: KeyIndex) -> Backbone | None:
    q = "layers.#.attention.to_q.weight"
    v = find_view(ix, q, "layers.#.adaln_modulation.weight", "layers.#.attention_norm2.weight")
    if v is None:
        return None
    why = (
        f"layers with sandwich norms and one modulation linear each ({v.blocks(q)}), hidden {v.dim(q, 1)}"
        " → Ideogram 4"
    )
    return _backbone(v, "ideogram4", q, why)


def glm_image(ix: KeyIndex) -> Backbone | None:
    q = "transformer_blocks.#.attn1.to_q.weight"
    v = find_view(ix, q, "prior_token_embedding.weight")
    if v is None or not v.has("time_condition_embed.timestep_embedder.linear_1.weight"):
        return None
    b = _backbone(v, "glm_image", q, f"transformer blocks ({v.blocks(q)}), hidden {v.dim(q, 1)}")
    v.because(b, "prior_token_embedding.weight", "an embedding of the prior's image tokens → GLM-Image")
    return b


def sana_video(ix: KeyIndex) -> Backbone | None:
    temp, q = "transformer_blocks.#.ff.conv_temp.weight", "transformer_blocks.#.attn1.to_q.weight"
    v = find_view(ix, temp, "transformer_blocks.#.ff.conv_inverted.weight", q)
    if v is None:  # the release's names (Sana's, `mlp.t_conv`: diffusers' convert_sana_video_to_diffusers.py)
        temp, q = "blocks.#.mlp.t_conv.weight", "blocks.#.attn.qkv.weight"
        v = find_view(
            ix, temp, "blocks.#.mlp.inverted_conv.conv.weight", q, "blocks.#.cross_attn.kv_linear.weight"
        )
        if v is None or v.has("blocks.#.plucker_proj.weight") or v.has("blocks.#.attn.q_proj_cam.weight"):
            return None  # SANA-WM's blocks hold `mlp.t_conv` too, beside their camera conditioning
    why = (
        f"Sana's linear-attention blocks with a temporal convolution in the Mix-FFN ({v.blocks(q)}),"
        f" hidden {v.dim(q, 1)} → SANA-Video"
    )
    return _backbone(v, "sana_video", temp, why)


def joyimage(ix: KeyIndex) -> Backbone | None:
    qkv = "double_blocks.#.attn.img_attn_qkv.weight"
    v = find_view(
        ix, qkv, "double_blocks.#.attn.txt_attn_qkv.weight", "double_blocks.#.img_mlp.net.0.proj.weight"
    )
    if v is None:
        return None
    hidden = v.dim(qkv, 1)
    why = f"double-stream blocks with one attention module for both streams ({v.blocks(qkv)}), hidden {hidden} → JoyImage"
    b = _backbone(v, "joyimage", qkv, why)
    v.because(
        b,
        qkv,
        "JoyImage-Edit and JoyImage-Edit-Plus share this layout key for key: the header cannot tell them apart",
    )
    return b


def bria_fibo2(ix: KeyIndex) -> Backbone | None:
    q = "layers.#.attention.to_q.weight"
    v = find_view(ix, q, "perceiver.layers.#.cross_attention.to_q.weight")
    if v is None:
        return None
    why = f"NextDiT-style layers ({v.blocks(q)}), hidden {v.dim(q, 1)}, behind a perceiver over the text → Bria FIBO 2"
    return _backbone(v, "bria_fibo2", q, why)


def sana_wm(ix: KeyIndex) -> Backbone | None:
    cam = "blocks.#.plucker_proj.weight"
    v = find_view(ix, cam, "blocks.#.attn.q_proj_cam.weight", "blocks.#.mlp.t_conv.weight")
    if v is None:
        return None
    q = "blocks.#.attn.qkv.weight"
    why = f"Sana's blocks with camera conditioning in each ({v.blocks(cam)}), hidden {v.dim(q, 1)} → SANA-WM"
    return _backbone(v, "sana_wm", cam, why)


def cosmos3(ix: KeyIndex) -> Backbone | None:
    gen = "layers.#.mlp_moe_gen.gate_proj.weight"
    v = find_view(ix, gen, "layers.#.self_attn.add_q_proj.weight", "layers.#.input_layernorm_moe_gen.weight")
    if v is None:
        return None
    q = "layers.#.self_attn.to_q.weight"
    why = (
        f"language-model layers with a second, generation pathway in each ({v.blocks(gen)}), hidden {v.dim(q, 1)}"
        " → Cosmos 3"
    )
    return _backbone(v, "cosmos3", gen, why)
