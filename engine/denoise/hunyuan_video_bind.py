"""Binding a HunyuanVideo 1.0 transformer's ops (engine.denoise.hunyuan_video) in its three namings — Tencent's
release names, ComfyUI's FLUX-style ones, diffusers' — and the pieces HunyuanVideo 1.5 and HunyuanImage 2.1 bind
the same way (their own layers beside 1.0's, the byT5 glyph projection)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import Ops, layer_norm_with, wshape
from .flux import Proj, Single, Stream
from .hunyuan_video import AXES, PATCH, HunyuanVideo, Refiner

# -- binding the file's ops -----------------------------------------------------------------------------

# ComfyUI's FLUX-style names -> Tencent's, beyond the LoRA table (engine.lora.family_names.HUNYUAN): the
# QK-norms, FLUX's `norm.query_norm` (ComfyUI's `process_unet_state_dict` renames the release's keys so)
_COMFY_NORMS = (("_attn.norm.query_norm", "_attn_q_norm"), ("_attn.norm.key_norm", "_attn_k_norm"))


def naming_of(mods) -> str:
    """ "tencent", "comfyui" or "diffusers": the naming a HunyuanVideo file's module paths are in."""
    if "x_embedder.proj" in mods or any(p.startswith("transformer_blocks.") for p in mods):
        return "diffusers"
    if any(p.endswith((".img_attn.qkv", ".img_mod.lin", ".modulation.lin")) for p in mods):
        return "comfyui"
    return "tencent"


def bind_hunyuan_video(
    ops: Ops, mods: dict, architecture: str, dtype: torch.dtype
) -> tuple[str, HunyuanVideo]:
    """(naming, the forward) of a HunyuanVideo 1.0 transformer in any of its three namings."""
    naming, ops, fields = bind_common(ops, mods, PATCH)
    if "clean_x_embedder.proj" in ops or "image_projection.up" in ops:  # FramePack (engine.denoise.framepack)
        from .framepack import HISTORY, FramePack

        clean = None
        if "clean_x_embedder.proj" in ops:
            clean = tuple(ops[f"clean_x_embedder.{n}"] for n in ("proj", "proj_2x", "proj_4x"))
            for op, kernel in zip(clean, HISTORY, strict=True):
                _check_patch(op, kernel, ops.what)
        image = (
            (ops["image_projection.up"], ops["image_projection.down"])
            if "image_projection.up" in ops
            else None
        )
        return naming, FramePack(
            architecture=architecture, dtype=dtype, **fields, clean=clean, image_proj=image
        )
    return naming, HunyuanVideo(architecture=architecture, dtype=dtype, **fields)


def bind_common(ops: Ops, mods: dict, patch: tuple[int, ...]) -> tuple[str, Ops, dict]:
    """(naming, the ops by Tencent's paths or diffusers', the fields of HunyuanVideo 1.0 and 1.5's shared
    parts): the patch embedding, the time, guidance and pooled-text embedders, the token refiner, the
    blocks, the final layer."""
    naming = naming_of(mods)
    if naming == "diffusers":
        return naming, ops, _bind_diffusers(ops, patch)
    if naming == "comfyui":
        ops = ops.renamed({_to_tencent(p, ops): m for p, m in mods.items()})
    return naming, ops, _bind_tencent(ops, patch)


# (Tencent's / ComfyUI's paths, diffusers' paths) of the byT5 glyph projection HunyuanVideo 1.5 and HunyuanImage 2.1 share
BYT5 = (("byt5_in.layernorm", "byt5_in.fc1", "byt5_in.fc2", "byt5_in.fc3"),
        ("context_embedder_2.norm", "context_embedder_2.linear_1", "context_embedder_2.linear_2",
         "context_embedder_2.linear_3"))  # fmt: skip
BYT5_EPS = 1e-5  # torch's LayerNorm default, which the projection keeps


def bind_with_own(ops: Ops, mods: dict, patch: tuple[int, ...], own: dict) -> tuple[str, Ops, dict, dict]:
    """bind_common (after ComfyUI's MLPEmbedder names of a MeanFlow time, `time_r_in.in_layer`), and each group of
    the family's own layers in `own` (name -> (Tencent's paths, diffusers' paths)): its ops, None where absent."""
    if "time_r_in.in_layer" in mods:
        mods = {{"time_r_in.in_layer": "time_r_in.mlp.0", "time_r_in.out_layer": "time_r_in.mlp.2"}.get(p, p): m
                for p, m in mods.items()}  # fmt: skip
        ops = ops.renamed(mods)
    naming, ops, fields = bind_common(ops, mods, patch)
    side = 1 if naming == "diffusers" else 0
    groups = {
        name: tuple(ops[p] for p in paths[side]) if paths[side][0] in ops else None
        for name, paths in own.items()
    }
    return naming, ops, fields, groups


def byt5_project(byt5: tuple, states: torch.Tensor) -> torch.Tensor:
    """The byT5 glyph states through their projection: LayerNorm, fc1, GELU, fc2, GELU, fc3."""
    norm, fc1, fc2, fc3 = byt5
    return fc3(F.gelu(fc2(F.gelu(fc1(layer_norm_with(norm, states, BYT5_EPS))))))


def _to_tencent(path: str, ops: Ops) -> str:
    from ..lora.family_names import HUNYUAN, to_original

    renamed = to_original([path], HUNYUAN).get(path)
    if renamed is not None:
        return renamed
    for comfy, tencent in _COMFY_NORMS:
        path = path.replace(comfy, tencent)
    if path.startswith("single_blocks."):
        path = path.replace(".norm.query_norm", ".q_norm").replace(".norm.key_norm", ".k_norm")
    return path


def _heads(q_norm, hidden: int, what: str) -> int:
    head = wshape(q_norm)[0]
    if head != sum(AXES) or hidden % head:
        raise UnsupportedModel(
            f"{what}: head width {head} with hidden size {hidden} — HunyuanVideo uses {sum(AXES)}-wide heads "
            f"(RoPE axes {AXES})"
        )
    return hidden // head


def _check_patch(img_in, patch: tuple[int, ...], what: str) -> int:
    shape = wshape(img_in)
    if len(shape) != 2 + len(patch) or tuple(shape[2:]) != patch:
        raise UnsupportedModel(
            f"{what}: a patch embedding of shape {list(shape)}, not this HunyuanVideo's {patch} video patches"
        )
    img_in.stride = patch  # the file holds the kernel; the stride is the architecture's
    return shape[0]


def _pair(ops: Ops, a: str, b: str) -> tuple[object, object] | None:
    return (ops[a], ops[b]) if a in ops else None


def _bind_tencent(ops: Ops, patch: tuple[int, ...]) -> dict:
    hidden = _check_patch(ops["img_in.proj"], patch, ops.what)

    def stream(p: str) -> Stream:
        return Stream(ops[f"{p}_mod.linear"], Proj(ops[f"{p}_attn_qkv"], (hidden,) * 3), ops[f"{p}_attn_q_norm"],
                      ops[f"{p}_attn_k_norm"], ops[f"{p}_attn_proj"], ops[f"{p}_mlp.fc1"], ops[f"{p}_mlp.fc2"])  # fmt: skip

    doubles = [(stream(f"double_blocks.{i}.img"), stream(f"double_blocks.{i}.txt"))
               for i in ops.children("double_blocks")]  # fmt: skip
    singles = []
    for i in ops.children("single_blocks"):
        p = f"single_blocks.{i}"
        lin1 = ops[f"{p}.linear1"]
        sizes = (hidden, hidden, hidden, wshape(lin1)[0] - 3 * hidden)
        singles.append(Single(ops[f"{p}.modulation.linear"], Proj(lin1, sizes), ops[f"{p}.q_norm"],
                              ops[f"{p}.k_norm"], ops[f"{p}.linear2"]))  # fmt: skip
    r = "txt_in.individual_token_refiner.blocks"
    refiner = [Refiner(ops[f"{r}.{n}.norm1"], Proj(ops[f"{r}.{n}.self_attn_qkv"], (hidden,) * 3),
                       ops[f"{r}.{n}.self_attn_proj"], ops[f"{r}.{n}.norm2"], ops[f"{r}.{n}.mlp.fc1"],
                       ops[f"{r}.{n}.mlp.fc2"], ops[f"{r}.{n}.adaLN_modulation.1"]) for n in ops.children(r)]  # fmt: skip
    if not doubles and not singles:
        raise UnsupportedModel(f"{ops.what}: no double or single blocks — not a HunyuanVideo transformer")
    q_norm = doubles[0][0].q_norm if doubles else singles[0].q_norm
    return dict(
        img_in=ops["img_in.proj"], time_in=(ops["time_in.mlp.0"], ops["time_in.mlp.2"]),
        guidance_in=_pair(ops, "guidance_in.mlp.0", "guidance_in.mlp.2"),
        vector_in=_pair(ops, "vector_in.in_layer", "vector_in.out_layer"), txt_proj=ops["txt_in.input_embedder"],
        txt_t=(ops["txt_in.t_embedder.mlp.0"], ops["txt_in.t_embedder.mlp.2"]),
        txt_c=(ops["txt_in.c_embedder.linear_1"], ops["txt_in.c_embedder.linear_2"]), refiner=refiner,
        doubles=doubles, singles=singles, final_mod=ops["final_layer.adaLN_modulation.1"], final_swapped=False,
        final_linear=ops["final_layer.linear"], heads=_heads(q_norm, hidden, ops.what),
    )  # fmt: skip


def _bind_diffusers(ops: Ops, patch: tuple[int, ...]) -> dict:
    _check_patch(ops["x_embedder.proj"], patch, ops.what)
    hidden = wshape(ops["x_embedder.proj"])[0]

    def parts(a: str, names: tuple[str, ...]) -> Proj:
        return Proj(None, parts=tuple(ops[f"{a}.{n}"] for n in names))

    doubles = []
    for i in ops.children("transformer_blocks"):
        p = f"transformer_blocks.{i}"
        a = f"{p}.attn"
        img = Stream(ops[f"{p}.norm1.linear"], parts(a, ("to_q", "to_k", "to_v")), ops[f"{a}.norm_q"],
                     ops[f"{a}.norm_k"], ops[f"{a}.to_out.0"], ops[f"{p}.ff.net.0.proj"], ops[f"{p}.ff.net.2"])  # fmt: skip
        txt = Stream(ops[f"{p}.norm1_context.linear"], parts(a, ("add_q_proj", "add_k_proj", "add_v_proj")),
                     ops[f"{a}.norm_added_q"], ops[f"{a}.norm_added_k"], ops[f"{a}.to_add_out"],
                     ops[f"{p}.ff_context.net.0.proj"], ops[f"{p}.ff_context.net.2"])  # fmt: skip
        doubles.append((img, txt))
    singles = []
    for i in ops.children("single_transformer_blocks"):
        p = f"single_transformer_blocks.{i}"
        a = f"{p}.attn"
        lin1 = Proj(None, parts=(ops[f"{a}.to_q"], ops[f"{a}.to_k"], ops[f"{a}.to_v"], ops[f"{p}.proj_mlp"]))
        singles.append(Single(ops[f"{p}.norm.linear"], lin1, ops[f"{a}.norm_q"], ops[f"{a}.norm_k"],
                              ops[f"{p}.proj_out"]))  # fmt: skip
    c = "context_embedder"
    r = f"{c}.token_refiner.refiner_blocks"
    refiner = [Refiner(ops[f"{r}.{n}.norm1"], parts(f"{r}.{n}.attn", ("to_q", "to_k", "to_v")),
                       ops[f"{r}.{n}.attn.to_out.0"], ops[f"{r}.{n}.norm2"], ops[f"{r}.{n}.ff.net.0.proj"],
                       ops[f"{r}.{n}.ff.net.2"], ops[f"{r}.{n}.norm_out.linear"]) for n in ops.children(r)]  # fmt: skip
    if not doubles and not singles:
        raise UnsupportedModel(f"{ops.what}: no transformer blocks — not a HunyuanVideo transformer")
    q_norm = doubles[0][0].q_norm if doubles else singles[0].q_norm

    def pair(p: str) -> tuple[object, object] | None:
        return _pair(ops, f"{p}.linear_1", f"{p}.linear_2")

    # 1.0's embedders are `time_text_embed`'s (time, pooled text, guidance); 1.5's time alone is `time_embed`'s;
    # HunyuanImage 2.1's time and guidance `time_guidance_embed`'s
    te = next(
        (e for e in ("time_text_embed", "time_guidance_embed") if f"{e}.timestep_embedder.linear_1" in ops),
        "time_embed",
    )
    return dict(
        img_in=ops["x_embedder.proj"], time_in=(ops[f"{te}.timestep_embedder.linear_1"], ops[f"{te}.timestep_embedder.linear_2"]),
        guidance_in=pair(f"{te}.guidance_embedder"), vector_in=pair(f"{te}.text_embedder"),
        txt_proj=ops[f"{c}.proj_in"], txt_t=pair(f"{c}.time_text_embed.timestep_embedder"),
        txt_c=pair(f"{c}.time_text_embed.text_embedder"), refiner=refiner, doubles=doubles, singles=singles,
        final_mod=ops["norm_out.linear"], final_swapped=True, final_linear=ops["proj_out"],
        heads=_heads(q_norm, hidden, ops.what),
    )  # fmt: skip
