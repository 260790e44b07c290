"""HunyuanVideo 1.0's transformer (text-to-video, the latent-concat image-to-video releases and SkyReels),
run on the component's own castable ops, in the file's own naming: Tencent's release names
(`img_attn_qkv`, `img_mod.linear`: the release files, musubi-tuner's), ComfyUI's FLUX-style names
(`img_attn.qkv`, `img_mod.lin`, renamed onto Tencent's) or diffusers' (`transformer_blocks`,
`single_transformer_blocks`, `context_embedder.token_refiner`).

Architecture facts, from Tencent/HunyuanVideo `hyvideo/modules/models.py`, `token_refiner.py`,
`posemb_layers.py` and diffusers' `HunyuanVideoTransformer3DModel` (written from that description, nothing
copied):

* x [B, C, F, H, W] → `img_in.proj`, a Conv3d over (1, 2, 2) patches → tokens in (frame, row, column)
  order. C: 16 (t2v), 33 (i2v: latent, image latent, mask), 32 (SkyReels).
* vec = time_in(emb(t)) + vector_in(text_states_2) [+ guidance_in(emb(guidance))], emb the 256-wide
  sinusoidal embedding (cosines first) of t itself (0–1000, the scheduler's timestep) and of the guidance
  as the pipeline passes it (1000 × the embedded guidance scale); `*_in` Linear, SiLU, Linear.
* The token refiner (`txt_in`): c = t_embedder(emb(t)) + c_embedder(mean of text_states over its mask);
  txt = input_embedder(text_states); then 2 blocks of txt += gate₁·proj(attn(norm1(txt))),
  txt += gate₂·fc2(SiLU(fc1(norm2(txt)))), (gate₁, gate₂) = adaLN_modulation.1(SiLU(c)); norm1 / norm2
  LayerNorms with their affine weights (eps 1e-6); no QK-norm and no RoPE there; a padded text token
  attends to nothing outside the prompt, and every token attends to the first.
* Double block (FLUX.1's: per stream Modulation → shift, scale, gate × 2; affine-free LayerNorm eps 1e-6;
  per-head RMSNorm of q and k, eps 1e-6; tanh-GELU MLP 4× wide) with the joint sequence in the order
  [img, txt] and RoPE on the image tokens only. Single block: linear1 → (q, k, v, mlp), linear2 of
  (attn, GELU(mlp)), over [img, txt], RoPE again on the image part.
* Attention: 128-wide heads (24 in the 13B release), every query attends to the image tokens and the
  prompt's text tokens (text_mask: the padding after them is left out).
* RoPE: three axes (frame, row, column) of widths (16, 56, 56), theta 256, on interleaved pairs (FLUX.1's
  layout).
* Final: (shift, scale) = final_layer.adaLN_modulation.1(SiLU(vec)) (diffusers' `norm_out.linear` holds
  them as scale, shift); final_layer.linear((1 + scale)·LN(x) + shift); each token's outputs are
  (channel, frame, row, column) of its patch.

The token-replace image-to-video release (HunyuanVideo-I2V's second version) shares the t2v layout key for
key: this forward runs it as t2v (its first frame's own modulation at t = 0 is the pipeline's to ask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import (
    Ops,
    layer_norm,
    layer_norm_with,
    merge_heads,
    mlp2,
    rms_norm_with,
    rope,
    split_heads,
    timestep_embedding,
    wshape,
)
from .flux import Proj, Single, Stream, rope_table  # FLUX.1's streams and single blocks, as HunyuanVideo's

AXES = (16, 56, 56)
THETA = 256.0
EPS = 1e-6
PATCH = (1, 2, 2)


@dataclass
class Refiner:
    """One block of the token refiner."""

    norm1: object
    qkv: Proj
    proj: object
    norm2: object
    fc1: object
    fc2: object
    ada: object

    def ops(self) -> list:
        return [self.ada, self.norm1, *self.qkv.ops(), self.proj, self.norm2, self.fc1, self.fc2]


@dataclass
class HunyuanVideo:
    """A bound HunyuanVideo transformer: call it with the original forward's inputs (x, t, text_states,
    text_states_2 [, guidance] [, text_mask])."""

    architecture: str
    img_in: object
    time_in: tuple[object, object]
    guidance_in: tuple[object, object] | None
    vector_in: tuple[object, object] | None
    txt_proj: object
    txt_t: tuple[object, object]
    txt_c: tuple[object, object]
    refiner: list[Refiner]
    doubles: list[tuple[Stream, Stream]]
    singles: list[Single]
    final_mod: object
    final_swapped: bool
    final_linear: object
    heads: int
    dtype: torch.dtype = torch.float32
    family = "hunyuan_video"
    patch = PATCH

    @property
    def in_channels(self) -> int:
        return wshape(self.img_in)[1]

    @property
    def context_dim(self) -> int:
        return wshape(self.txt_proj)[1]

    @property
    def vec_dim(self) -> int:
        return wshape(self.vector_in[0])[1] if self.vector_in is not None else 0

    def __call__(self, x, t, text_states, text_states_2, guidance=None, text_mask=None) -> torch.Tensor:
        dt = self.dtype
        img, pe = self._patches(x)
        vec = mlp2(self.time_in, timestep_embedding(t.float(), 256).to(dt))
        if self.guidance_in is not None:
            if guidance is None:
                raise ValueError("this HunyuanVideo takes a `guidance` input (1000 × the guidance scale)")
            vec = vec + mlp2(self.guidance_in, timestep_embedding(guidance.float(), 256).to(dt))
        if self.vector_in is not None:
            vec = vec + mlp2(self.vector_in, text_states_2.to(dt))
        mask = _mask(text_mask)
        txt = self._refine(text_states, t, mask)
        return self._run(x.shape, img, txt, mask, vec, pe)

    def _patches(self, x):
        """The image tokens ([B, F·h·w / patch, D], (frame, row, column) order) and their RoPE table."""
        b, _, f, h, w = x.shape
        pf, ph, pw = self.patch
        img = self.img_in(x.to(self.dtype)).flatten(2).transpose(1, 2)
        return img, rope_table(_positions(f // pf, h // ph, w // pw, x.device).expand(b, -1, -1), AXES, THETA)

    def _run(self, shape, img, txt, mask, vec, pe, keep: int | None = None) -> torch.Tensor:
        """The blocks over [img, txt] (`mask` [B, T] the text tokens every query attends to, None for all),
        the final layer on the last `keep` image tokens (all by default: FramePack's history comes first), and the
        patches back into the latent's shape."""
        b = shape[0]
        n_img = img.shape[1]
        keys = None
        if mask is not None:  # the image tokens and the prompt's own text tokens
            keys = torch.cat([torch.ones(b, n_img, dtype=torch.bool, device=mask.device), mask], dim=1)
            keys = keys[:, None, None, :]
        vs = F.silu(vec)
        for img_s, txt_s in self.doubles:
            img, txt = self._double(img_s, txt_s, img, txt, vs, pe, keys)
        seq = torch.cat([img, txt], dim=1)
        del img, txt
        for blk in self.singles:
            seq = self._single(blk, seq, n_img, vs, pe, keys)
        img = seq[:, n_img - (keep or n_img) : n_img]
        shift, scale = self.final_mod(vs).chunk(2, dim=-1)
        if self.final_swapped:
            shift, scale = scale, shift
        return self._unpatch(
            self.final_linear((1 + scale[:, None]) * layer_norm(img) + shift[:, None]), shape
        )

    def _unpatch(self, out: torch.Tensor, shape) -> torch.Tensor:
        """[B, tokens, (c, pf, ph, pw)] -> [B, C, F, H, W]."""
        b, _, f, h, w = shape
        pf, ph, pw = self.patch
        c = out.shape[-1] // (pf * ph * pw)
        out = out.reshape(b, f // pf, h // ph, w // pw, c, pf, ph, pw)
        return out.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(b, c, f, h, w)

    # -- the token refiner ----------------------------------------------------------------------------

    def _refine(self, text_states, t, mask):
        dt = self.dtype
        s = text_states.to(dt)
        if mask is None:
            pooled = s.mean(dim=1)
        else:
            m = mask.to(s.dtype)[..., None]
            pooled = (s * m).sum(dim=1) / m.sum(dim=1)
        c = mlp2(self.txt_t, timestep_embedding(t.float(), 256).to(dt)) + mlp2(self.txt_c, pooled)
        txt = self.txt_proj(s)
        attn_mask = None if mask is None else self._refiner_mask(mask)
        cs = F.silu(c)
        for blk in self.refiner:
            g1, g2 = blk.ada(cs)[:, None].chunk(2, dim=-1)
            q, k, v = (split_heads(p, self.heads) for p in blk.qkv(layer_norm_with(blk.norm1, txt, EPS)))
            a = merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask))
            txt = txt + g1 * blk.proj(a)
            txt = txt + g2 * blk.fc2(F.silu(blk.fc1(layer_norm_with(blk.norm2, txt, EPS))))
        return txt

    @staticmethod
    def _refiner_mask(mask: torch.Tensor) -> torch.Tensor:
        """Token i sees token j when both are the prompt's; every token sees the first (the original's guard
        against a padded row that sees nothing)."""
        attn_mask = (mask[:, :, None] & mask[:, None, :])[:, None]
        attn_mask[..., 0] = True
        return attn_mask

    # -- the blocks -----------------------------------------------------------------------------------

    def _qkv(self, qkv: Proj, q_norm, k_norm, x):
        q, k, v = (split_heads(p, self.heads) for p in qkv(x)[:3])
        return rms_norm_with(q_norm, q, EPS).to(v.dtype), rms_norm_with(k_norm, k, EPS).to(v.dtype), v

    def _double(self, i: Stream, s: Stream, img, txt, vs, pe, keys):
        im = i.mod(vs)[:, None].chunk(6, dim=-1)
        tm = s.mod(vs)[:, None].chunk(6, dim=-1)
        iq, ik, iv = self._qkv(i.qkv, i.q_norm, i.k_norm, (1 + im[1]) * layer_norm(img) + im[0])
        tq, tk, tv = self._qkv(s.qkv, s.q_norm, s.k_norm, (1 + tm[1]) * layer_norm(txt) + tm[0])
        q = torch.cat([rope(iq, pe), tq], dim=2)
        k = torch.cat([rope(ik, pe), tk], dim=2)
        a = merge_heads(F.scaled_dot_product_attention(q, k, torch.cat([iv, tv], dim=2), attn_mask=keys))
        n = img.shape[1]
        return _after(i, img, a[:, :n], im), _after(s, txt, a[:, n:], tm)

    def _single(self, blk: Single, seq, n_img: int, vs, pe, keys):
        shift, scale, gate = blk.mod(vs)[:, None].chunk(3, dim=-1)
        q, k, v, mlp = blk.linear1((1 + scale) * layer_norm(seq) + shift)
        q, k, v = (split_heads(p, self.heads) for p in (q, k, v))
        q, k = rms_norm_with(blk.q_norm, q, EPS).to(v.dtype), rms_norm_with(blk.k_norm, k, EPS).to(v.dtype)
        q = torch.cat([rope(q[:, :, :n_img], pe), q[:, :, n_img:]], dim=2)
        k = torch.cat([rope(k[:, :, :n_img], pe), k[:, :, n_img:]], dim=2)
        a = merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=keys))
        return seq + gate * blk.linear2(torch.cat([a, F.gelu(mlp, approximate="tanh")], dim=2))

    def op_order(self) -> list:
        order = [self.img_in, *self.time_in, *(self.guidance_in or ()), *(self.vector_in or ()), *self.txt_t,
                 *self.txt_c, self.txt_proj]  # fmt: skip
        for blk in self.refiner:
            order += blk.ops()
        for i, s in self.doubles:
            order += [i.mod, s.mod, *i.ops_before_attention(), *s.ops_before_attention(),
                      i.proj, i.mlp_in, i.mlp_out, s.proj, s.mlp_in, s.mlp_out]  # fmt: skip
        for blk in self.singles:
            order += blk.ops()
        return [*order, self.final_mod, self.final_linear]


def _after(s: Stream, x, attn, m):
    x = x + m[2] * s.proj(attn)
    y = s.mlp_in((1 + m[4]) * layer_norm(x) + m[3])
    return x + m[5] * s.mlp_out(F.gelu(y, approximate="tanh"))


def _mask(mask) -> torch.Tensor | None:
    """A [B, T] 0/1 mask as booleans, or None where every token counts."""
    return None if mask is None or bool(mask.all()) else mask.bool()


def _positions(f: int, h: int, w: int, device) -> torch.Tensor:
    """[1, f·h·w, 3] (frame, row, column) of each image token, in the patch convolution's order."""
    grid = torch.meshgrid(
        *(torch.arange(n, device=device, dtype=torch.float32) for n in (f, h, w)), indexing="ij"
    )
    return torch.stack(grid, dim=-1).reshape(1, f * h * w, 3)


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
