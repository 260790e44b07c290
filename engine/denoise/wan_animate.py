"""Wan 2.2 Animate's transformer (Wan-AI Wan2.2-Animate-14B): Wan 2.1's I2V network (engine.denoise.wan) with a
pose patch embedding, a motion encoder and a face encoder over a face video, and a face adapter whose
cross-attention runs after every few blocks; run on the component's own castable ops in the release's naming.

Architecture facts, from Wan-Video/Wan2.2 `wan/modules/animate/model_animate.py` (WanAnimateModel: its forward's
arguments x, t, clip_fea, context, seq_len, y, pose_latents, face_pixel_values; after_patch_embedding,
after_transformer_block), `face_blocks.py` (FaceEncoder, FaceBlock) and the motion encoder it builds
(`Generator(size=512, style_dim=512, motion_dim=20)`, LIA's), as diffusers' WanAnimateTransformer3DModel
(`transformer_wan_animate.py`) restates them; its single-file converter (`convert_wan_transformer_to_diffusers`:
generate_motion_encoder_mappings, generate_face_adapter_mappings, the [1, C, 1, 1] biases it reshapes, the fused
`linear1_kv` it splits in halves) gives the two namings. Written from that description, nothing copied:

* x [B, 36, F, h, w] (the noisy latent, mask and reference latents, concatenated: the original's x and y) through
  Wan's patch embedding; `pose_latents` [B, 16, F − 1, h, w] through `pose_patch_embedding` (the same 1×2×2
  patching) are added to every frame but the first (the reference frame's).
* Motion encoder, per face frame ([3, S, S] in −1…1, S = 512), in batches of 8 frames as the original: an
  appearance CNN of equalized-learning-rate convolutions (each weight times 1/√(fan-in) at run time) — a 1×1
  conv, then log₂S − 2 residual blocks (3×3 conv; (1,3,3,1)-blur then 3×3 conv of stride 2; skip: blur then
  1×1 conv of stride 2; (out + skip)/√2), each activated conv followed by a fused leaky ReLU (bias, slope 0.2,
  gain √2) — and a 4×4 conv to a 512-vector; 5 equalized Linears (no activation) to 20 motion coefficients;
  those weight the orthonormal basis Q of QR(`direction` [512, 20] + 1e-8), in float32: the motion vector
  Σⱼ aⱼ·Q[:, j]. The blur is the normalized outer product of (1, 3, 3, 1), padded ((p + 1)/2, p/2) for p = 4 −
  stride + kernel − 1; the release stores it beside the convolutions (`conv2.0.kernel`, `skip.0.kernel`), which
  the forward reads as the original's buffer is.
* Face encoder over the T motion vectors: causal Conv1d stack, each replicate-padded by 2 frames in front —
  `conv1_local` (k 3) to 4 heads × 1024, split into the heads; LayerNorm (no affine, eps 1e-6), SiLU; `conv2`
  and `conv3` (k 3, stride 2), each followed by the same norm and SiLU; `out_proj` to the width; the learned
  `padding_tokens` appended as a 5th token per frame; then a frame of zeros is put in front (the reference
  frame's): [B, (T − 1)//4 + 2, 5, dim], one motion frame per latent frame.
* After blocks 0, k, 2k, … (k = `inject_face_latents_blocks`, 5 in the release: 40 blocks, 8 adapters) the
  face adapter adds linear2(attention) to the tokens: queries from LayerNorm(x) (no affine, eps 1e-6), keys
  and values from LayerNorm(motion) (`linear1_kv`, k then v), per-head RMSNorm of q and k (eps 1e-6, over the
  128-wide head), heads of 128, each latent frame's tokens attending to its own motion frame's 5 tokens.
* Everything else is Wan 2.1's I2V: one timestep per sample, CLIP ViT-H image states (257 tokens) through
  `img_emb` and each cross-attention's k_img / v_img.

diffusers' `transformer_wan_animate_2.py` (Wan-Animate-2, in-context attention over driving-video latents
with a KV cache) is another network: its blocks wrap each Wan block (`blocks.N.block.…`) and it has no motion
or face encoder; engine.denoise.wan_animate2 runs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from ..ops import check_cancelled
from .common import Ops, held, wshape
from .wan import EPS, Wan, bind_wan

APP = "motion_encoder.enc.net_app.convs"  # the appearance CNN's layers in the release's naming
ENCODE_BATCH = 8  # face frames per motion-encoder batch (the original's encode_bs)
BLUR = (1.0, 3.0, 3.0, 1.0)
SLOPE, GAIN = 0.2, math.sqrt(2.0)  # the fused leaky ReLU's
QR_EPS = 1e-8  # added to the direction weights before their QR, as the original
FRAMES = 3  # random inputs: the reference latent frame and two driven ones
INPUTS = ("pose_latents", "face_pixel_values")


@dataclass
class EqualConv:
    """An equalized-lr convolution: its op (stride and padding set from the architecture), the plain holder of
    its fused leaky ReLU's bias (None: no activation), and, before a strided one, the blur (its holder of the
    stored kernel, or None for the (1,3,3,1) kernel built here)."""

    conv: object
    act: object = None
    blur: bool = False
    kernel: object = None

    def scale(self) -> float:
        o, i, kh, kw = wshape(self.conv)
        return 1.0 / math.sqrt(i * kh * kw)


@dataclass
class FaceBlock:
    q: object
    o: object
    norm_q: object
    norm_k: object
    kv: object = None  # the release's fused linear1_kv, or diffusers' to_k and to_v
    k: object = None
    v: object = None

    def ops(self) -> list:
        kv = [self.kv] if self.kv is not None else [self.k, self.v]
        return [*kv, self.q, self.norm_q, self.norm_k, self.o]


@dataclass
class WanAnimate(Wan):
    """A bound Wan Animate transformer: Wan's inputs (x, t, context, clip_fea) and the pose latents and face video."""

    pose_patch_embedding: object = None
    convs: tuple = ()  # the appearance CNN: conv_in, then (conv1, conv2, skip) per residual block, then conv_out
    fc: tuple = ()
    direction: tuple = (None, "weight")  # (op or plain holder, attribute) of the [512, 20] direction weights
    face_convs: tuple = ()  # conv1_local, conv2, conv3
    face_out: object = None
    face_pad: object = None  # the plain holder of `padding_tokens`
    face_blocks: tuple = ()
    inject: int = 5
    extra_inputs = INPUTS

    @property
    def face_size(self) -> int:
        """The face frames' side in pixels: the appearance CNN halves it per residual block down to 4."""
        return 4 << ((len(self.convs) - 2) // 3)

    def __call__(
        self, x, t, context, clip_fea=None, pose_latents=None, face_pixel_values=None
    ) -> torch.Tensor:
        if pose_latents is None or face_pixel_values is None:
            raise FormatError("Wan Animate takes pose_latents and face_pixel_values beside Wan's inputs")
        dt = self.dtype
        h = self.patch_embedding(x.to(dt))
        pose = self.pose_patch_embedding(pose_latents.to(dt))
        h = torch.cat([h[:, :, :1], h[:, :, 1:] + pose], dim=2)  # every frame but the reference one
        del pose
        motion = self._face_encoder(self._motion(face_pixel_values))
        motion = torch.cat([motion.new_zeros(motion[:, :1].shape), motion], dim=1)

        def after(i: int, tokens: torch.Tensor) -> torch.Tensor:
            if i % self.inject:
                return tokens
            return tokens + self._face_block(self.face_blocks[i // self.inject], tokens, motion)

        return self.run(h, t, context, clip_fea, after_block=after)

    # -- the motion encoder -------------------------------------------------------------------------------
    def _motion(self, faces: torch.Tensor) -> torch.Tensor:
        """[B, 3, T, S, S] face video -> [B, T, 512] motion vectors, ENCODE_BATCH frames at a time."""
        b, c, n, s, _ = faces.shape
        frames = faces.to(self.dtype).permute(0, 2, 1, 3, 4).reshape(b * n, c, s, s)
        q = None
        out = []
        for chunk in frames.split(ENCODE_BATCH):
            check_cancelled()
            a = self._appearance(chunk)
            for lin in self.fc:
                a = lin(a * (1.0 / math.sqrt(wshape(lin)[1])))
            if q is None:  # the direction's orthonormal basis, in float32 (the original upcasts its QR)
                q = torch.linalg.qr(self._direction(a).float() + QR_EPS)[0]
            out.append((a.float() @ q.T).to(self.dtype))  # Σⱼ aⱼ·Q[:, j]
        return torch.cat(out).reshape(b, n, -1)

    def _direction(self, like: torch.Tensor) -> torch.Tensor:
        holder, attr = self.direction
        if attr == "weight":  # the release's `dec.direction`: an op, fetched (and streamed) as one
            return holder.cast_params(like)[0]
        return held(holder, attr, like.device).to(like.device)

    def _appearance(self, x: torch.Tensor) -> torch.Tensor:
        x = self._conv(self.convs[0], x)
        for i in range(1, len(self.convs) - 1, 3):
            conv1, conv2, skip = self.convs[i : i + 3]
            y = self._conv(conv2, self._conv(conv1, x))
            x = (y + self._conv(skip, x)) / math.sqrt(2.0)
        return self._conv(self.convs[-1], x).flatten(1)

    def _conv(self, layer: EqualConv, x: torch.Tensor) -> torch.Tensor:
        if layer.blur:
            x = _blur(x, layer)
        y = layer.conv(x * layer.scale())
        if layer.act is None:
            return y
        bias = held(layer.act, "bias", y.device).to(y.device, y.dtype).reshape(1, -1, 1, 1)
        return F.leaky_relu(y + bias, SLOPE) * GAIN

    # -- the face encoder and adapter ---------------------------------------------------------------------
    def _face_encoder(self, motion: torch.Tensor) -> torch.Tensor:
        """[B, T, 512] -> [B, T', heads + 1, dim]: the causal conv stack per head, the padding token appended."""
        b = motion.shape[0]
        x = motion.transpose(1, 2)
        heads = wshape(self.face_convs[0])[0] // wshape(self.face_convs[1])[1]
        for j, conv in enumerate(self.face_convs):
            x = conv(F.pad(x, (wshape(conv)[2] - 1, 0), mode="replicate"))
            if j == 0:  # [B, heads·C, T] -> [B·heads, C, T]
                x = x.unflatten(1, (heads, -1)).flatten(0, 1)
            x = F.silu(F.layer_norm(x.transpose(1, 2).float(), (x.shape[1],), eps=EPS)).to(self.dtype)
            x = x.transpose(1, 2)
        x = self.face_out(x.transpose(1, 2)).unflatten(0, (b, heads)).transpose(1, 2)  # [B, T', heads, dim]
        pad = held(self.face_pad, "padding_tokens", x.device).to(x.device, x.dtype)
        return torch.cat([x, pad.expand(b, x.shape[1], 1, -1)], dim=2)

    def _face_block(self, fb: FaceBlock, x: torch.Tensor, motion: torch.Tensor) -> torch.Tensor:
        """The face adapter's attention: each latent frame's tokens over its own motion frame's tokens."""
        dt = self.dtype
        b, s, dim = x.shape
        frames = motion.shape[1]
        m = F.layer_norm(motion.float(), (dim,), eps=EPS).to(dt)
        if fb.kv is not None:
            k, v = fb.kv(m).chunk(2, dim=-1)
        else:
            k, v = fb.k(m), fb.v(m)
        q = fb.q(F.layer_norm(x.float(), (dim,), eps=EPS).to(dt))
        q = fb.norm_q(q.unflatten(-1, (self.heads, -1)))  # [B, S, H, D], normed over each head
        k = fb.norm_k(k.unflatten(-1, (self.heads, -1))).flatten(0, 1)  # [B·T, N, H, D]
        v = v.unflatten(-1, (self.heads, -1)).flatten(0, 1)
        q = q.unflatten(1, (frames, -1)).flatten(0, 1)  # [B·T, S/T, H, D]
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2).to(q.dtype), v.transpose(1, 2).to(q.dtype)
        )
        return fb.o(o.transpose(1, 2).reshape(b, s, dim))

    def op_order(self) -> list:
        stem = [self.pose_patch_embedding, *(layer.conv for layer in self.convs), *self.fc]
        if self.direction[1] == "weight":
            stem.append(self.direction[0])
        stem += [*self.face_convs, self.face_out]

        def after(i: int) -> list:
            return [] if i % self.inject else self.face_blocks[i // self.inject].ops()

        return super().op_order(stem=tuple(stem), after_block=after)

    # -- inputs ---------------------------------------------------------------------------------------------
    def random_extra(self, out: dict, g: torch.Generator) -> dict:
        """Wan's random inputs made an Animate clip: FRAMES latent frames, their pose latents, and the face video
        of those frames (4·(F − 2) + 1 frames, as the pipeline's 77 for 21 latent frames) in −1…1."""
        b, c, _, h, w = out["x"].shape
        out["x"] = torch.randn(b, c, FRAMES, h, w, generator=g)
        out["pose_latents"] = torch.randn(
            b, wshape(self.pose_patch_embedding)[1], FRAMES - 1, h, w, generator=g
        )
        s = self.face_size
        out["face_pixel_values"] = torch.rand(b, 3, 4 * (FRAMES - 2) + 1, s, s, generator=g) * 2 - 1
        return out

    def shapes_extra(self, got: dict) -> dict:
        x = got["x"]
        f, h, w = tuple(x.shape[2:]) if x.dim() == 5 else (None, None, None)
        s = self.face_size
        pose = (None, wshape(self.pose_patch_embedding)[1], None if f is None else f - 1, h, w)
        return {"pose_latents": pose, "face_pixel_values": (None, 3, None, s, s)}

    def check_extra(self, got: dict, source: str) -> None:
        """The face video's frames must give one motion frame per driven latent frame: (T − 1)//4 + 1 = F − 1."""
        f, n = got["x"].shape[2], got["face_pixel_values"].shape[2]
        if f < 2 or (n - 1) // 4 + 1 != f - 1:
            lo = 4 * (f - 2) + 1
            raise FormatError(
                f"{source}: face_pixel_values has {n} frames for x's {f} latent frames; Wan Animate needs "
                + (f"{lo} to {lo + 3} (4·(F − 2) + 1, as its pipeline's 77 for 21)" if f >= 2 else "x to hold "
                   "the reference frame and at least one driven frame")
            )  # fmt: skip


def _blur(x: torch.Tensor, layer: EqualConv) -> torch.Tensor:
    """The FIR blur before a strided conv: depthwise, zero-padded ((p + 1)/2, p/2), p = taps − stride + k − 1."""
    if layer.kernel is not None:  # the stored buffer, flipped as the original's upfirdn2d convolves with it
        k = held(layer.kernel, "kernel", x.device).to(x.device, torch.float32).flip(0, 1)
    else:
        k1 = torch.tensor(BLUR, device=x.device)
        k = k1[:, None] * k1[None, :]
        k = k / k.sum()
    p = k.shape[0] - layer.conv.stride[0] + wshape(layer.conv)[2] - 1
    x = F.pad(x, ((p + 1) // 2, p // 2, (p + 1) // 2, p // 2))
    c = x.shape[1]
    return F.conv2d(x, k.to(x.dtype)[None, None].expand(c, 1, -1, -1), groups=c)


def _equal_conv(
    ops: Ops, plain, path: str, stride: int, pad: int, act: str | None, blur: str | None
) -> EqualConv:
    """The op at `path` with the architecture's stride and zero padding (the file holds neither), its activation's
    bias holder `act` and, before a strided conv, the blur (`blur`: where the release keeps its kernel)."""
    conv = ops[path]
    conv.stride, conv.padding = (stride, stride), (pad, pad)
    if act is not None and act not in plain:
        raise UnsupportedModel(f"{ops.what}: no bias {act!r} for the motion encoder's activation")
    return EqualConv(conv, plain[act] if act else None, blur is not None, plain.get(blur) if blur else None)


def bind_wan_animate(ops: Ops, architecture: str, dtype: torch.dtype, plain) -> WanAnimate:
    """Wan Animate in the release's naming (a diffusers-named file renamed onto it: `diffusers_paths`)."""
    base = bind_wan(ops, architecture, dtype, plain)
    if base.img_emb is None:
        raise UnsupportedModel(f"{ops.what}: Wan Animate layers without the CLIP image branch it is built on")
    pose = ops["pose_patch_embedding"]
    pose.stride = pose.kernel_size
    n = len({int(p[len(APP) + 1 :].split(".")[0]) for p in ops.by_path if p.startswith(APP + ".")})
    if n < 3:
        raise UnsupportedModel(f"{ops.what}: a motion encoder of {n} layers, not Wan Animate's")
    # conv_in 1×1; per block a 3×3 conv padded by 1, a blurred 3×3 of stride 2 and a blurred 1×1 skip of stride
    # 2, both unpadded; conv_out 4×4 over the 4×4 map
    convs = [_equal_conv(ops, plain, f"{APP}.0.0", 1, 0, f"{APP}.0.1", None)]
    for i in range(1, n - 1):
        r = f"{APP}.{i}"
        convs += [
            _equal_conv(ops, plain, f"{r}.conv1.0", 1, 1, f"{r}.conv1.1", None),
            _equal_conv(ops, plain, f"{r}.conv2.1", 2, 0, f"{r}.conv2.2", f"{r}.conv2.0"),
            _equal_conv(ops, plain, f"{r}.skip.1", 2, 0, None, f"{r}.skip.0"),
        ]
    convs.append(_equal_conv(ops, plain, f"{APP}.{n - 1}", 1, 0, None, None))
    fc = tuple(ops[f"motion_encoder.enc.fc.{i}"] for i in ops.children("motion_encoder.enc.fc"))
    d = ops.get("motion_encoder.dec.direction")
    if (d is None and "motion_encoder.dec.direction" not in plain) or "face_encoder" not in plain:
        raise UnsupportedModel(
            f"{ops.what}: no motion direction or face padding tokens: not Wan Animate's layout"
        )
    direction = (
        (d, "weight") if d is not None else (plain["motion_encoder.dec.direction"], "motion_synthesis_weight")
    )
    face_convs = tuple(ops[f"face_encoder.{c}.conv"] for c in ("conv1_local", "conv2", "conv3"))
    for conv, stride in zip(face_convs, (1, 2, 2), strict=True):
        conv.stride = (stride,)
    blocks = []
    for i in ops.children("face_adapter.fuser_blocks"):
        p = f"face_adapter.fuser_blocks.{i}"
        fb = FaceBlock(ops[f"{p}.linear1_q"], ops[f"{p}.linear2"], ops[f"{p}.q_norm"], ops[f"{p}.k_norm"])
        if f"{p}.linear1_kv" in ops:
            fb.kv = ops[f"{p}.linear1_kv"]
        else:
            fb.k, fb.v = ops[f"{p}.to_k"], ops[f"{p}.to_v"]
        if wshape(fb.norm_q)[0] * base.heads != base.dim:
            raise UnsupportedModel(
                f"{ops.what}: face adapter heads of {wshape(fb.norm_q)[0]}, not the blocks' 128"
            )
        blocks.append(fb)
    layers = len(base.blocks)
    if not blocks or layers % len(blocks):
        raise UnsupportedModel(
            f"{ops.what}: {len(blocks)} face adapter blocks over {layers} blocks: not spread as Wan Animate's"
        )
    return WanAnimate(
        **{f.name: getattr(base, f.name) for f in fields(Wan)}, pose_patch_embedding=pose, convs=tuple(convs),
        fc=fc, direction=direction, face_convs=face_convs, face_out=ops["face_encoder.out_proj"],
        face_pad=plain["face_encoder"], face_blocks=tuple(blocks), inject=layers // len(blocks),
    )  # fmt: skip


def is_animate(mods) -> bool:
    """Wan Animate's own layers, in either naming."""
    return "pose_patch_embedding" in mods or any(
        p.startswith(("face_adapter.", "motion_encoder.")) for p in mods
    )


_FACE = {
    "to_q": "linear1_q",
    "to_k": "to_k",
    "to_v": "to_v",
    "to_out": "linear2",
    "norm_q": "q_norm",
    "norm_k": "k_norm",
}
_RES = {
    "conv1": "conv1.0",
    "conv1.act_fn": "conv1.1",
    "conv2": "conv2.1",
    "conv2.act_fn": "conv2.2",
    "conv_skip": "skip.1",
}


def diffusers_paths(paths) -> dict[str, str]:
    """diffusers path -> the release's for WanAnimateTransformer3DModel's own modules (the inverse of diffusers'
    generate_motion_encoder_mappings / generate_face_adapter_mappings; to_k / to_v, which the release fuses as
    linear1_kv, keep their names, and `motion_encoder`'s motion_synthesis_weight is the direction's)."""
    paths = list(paths)
    n = len({p.split(".")[2] for p in paths if p.startswith("motion_encoder.res_blocks.")})
    out = {}
    for p in paths:
        q = _release_path(p, n)
        if q is not None:
            out[p] = q
    return out


def _release_path(p: str, n: int) -> str | None:
    parts = p.split(".")
    if p in ("pose_patch_embedding", "face_encoder", "face_encoder.out_proj"):
        return p
    if p == "motion_encoder":
        return "motion_encoder.dec.direction"
    if len(parts) == 2 and parts[0] == "face_encoder" and parts[1] in ("conv1_local", "conv2", "conv3"):
        return f"{p}.conv"
    if len(parts) == 3 and parts[0] == "face_adapter" and parts[1].isdigit() and parts[2] in _FACE:
        return f"face_adapter.fuser_blocks.{parts[1]}.{_FACE[parts[2]]}"
    if parts[0] != "motion_encoder" or len(parts) < 2:
        return None
    rest = ".".join(parts[1:])
    top = {"conv_in": "0.0", "conv_in.act_fn": "0.1", "conv_out": str(n + 1)}
    if rest in top:
        return f"{APP}.{top[rest]}"
    if len(parts) == 3 and parts[1] == "motion_network" and parts[2].isdigit():
        return f"motion_encoder.enc.fc.{parts[2]}"
    leaf = _RES.get(".".join(parts[3:]))
    if parts[1] == "res_blocks" and parts[2].isdigit() and leaf:
        return f"{APP}.{int(parts[2]) + 1}.{leaf}"
    return None
