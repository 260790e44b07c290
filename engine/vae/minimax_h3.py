"""MiniMax-H3's video VAE: its decoder, a ViT over latent voxels, decoded clip by clip and tile by tile as the release
defines its output (its encoder, a causal 3-D CNN, is engine.vae.minimax_h3_encoder).

Facts (diffusers `autoencoder_kl_minimax_h3.py`, AutoencoderKLMiniMaxH3; learned, not copied):
* Decode: `post_quant_conv` (a 1x1x1 Conv3d over the z = 24 latent channels), then `decoder`: every latent voxel a
  token (`proj_in`, z -> dim = heads x 64), `register_tokens` [1, R, dim] and one all-zero token appended, `L`
  `transformer_blocks` of full self-attention, `norm_out` (LayerNorm, affine, eps 1e-5) and `proj_out` (dim ->
  3 x 4 x 16 x 16): each voxel's token becomes a 4-frame, 16x16-pixel block ((channel, t, y, x) order); the
  appended tokens are dropped.
* A block: x + attn(RMSNorm1(x)) * scale1, then x + ff(RMSNorm2(x)) * scale2 (learned per-channel `scale1` /
  `scale2`; RMS norms with weights, eps 1e-5, computed in float32 and the residual stream kept float32 -- the
  release pins them, `_keep_in_fp32_modules`). Attention: biased `to_q` / `to_k` / `to_v` / `to_out.0`, heads of
  64, per-head RMS norms of q and k without weights (float32), then RoPE on the first 48 channels of each head
  (rotate-half pairs): per axis (t, y, x) the voxel's coordinate length-normalised to [-1, 1) (2 (i + 0.5) / n - 1),
  times 2 pi, times 100^(-6j/48) for j < 8; the three axes' angles concatenated, then twice over. The appended
  tokens sit at coordinate 0. FF: SwiGLU, `ff.net.0.proj` (dim -> 2 x 4 dim: value half, then gate half),
  `ff.net.2` back.
* Heads are not in the weights: 64-wide (the released `decoder_attention_head_dim`), so heads = dim / 64.
* Time: the encoder took 17-frame clips (`clip_length`) and dropped 3 trailing latent frames (`token_drop`) of
  each; the decoder mirrors it. Latent frames go in chunks of 5 (ceil(17 / 4)) with 2 more for overlap
  ((-3) mod 5); of each chunk's 28 output frames, frames 3-19 are kept (17: the 3 leading ones pad the clip
  to a multiple of 4) and frames 23-27 (5) wait to be cross-faded linearly into the next chunk's first 5; the
  last chunk's 5 are appended. The latent is padded with copies of its last frame to whole chunks, and the
  frames those copies made are cut off. 5n + 2 latent frames give 17n + 5 frames.
* Space: the released output is the tiled one (diffusers keeps tiling on by default: "the released frames
  are the blended-tile ones"): 256-px tiles, overlaps of at least 64 px widened in 16-px steps, round robin,
  so that the tiles end exactly at the frame's edge; each tile blended linearly into the one above and the
  one to its left over their overlap (the raw neighbours), then cut at its next overlap. `tile` None
  decodes each chunk whole (diffusers' `disable_tiling`).
* Pixels: ImageNet-normalised RGB (mean 0.485 0.456 0.406, std 0.229 0.224 0.225): mapped here to [-1, 1]
  (2 (x std + mean) - 1), Loadout's convention.
The encoder is built beside the decoder where the file holds it (`encoder.*`, `quant_conv.*`): see
engine.vae.minimax_h3_encoder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..errors import FormatError, UnsupportedModel
from .choice import release_tiles as split_tiles
from .estimate import vit_frames

HEAD_DIM = 64
ROPE_RATIO, ROPE_THETA = 0.75, 100.0
EPS = 1e-5
CLIP_LENGTH, TOKEN_DROP = 17, 3
TILE_PX, TILE_OVERLAP_PX = 256, 64
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def is_minimax_h3(sd) -> bool:
    return "decoder.register_tokens" in sd and "decoder.proj_in.weight" in sd


@dataclass(frozen=True)
class H3Config:
    z: int
    dim: int
    layers: int
    registers: int
    ffn: int  # the SwiGLU's inner width
    patch: int = 16
    patch_t: int = 4
    image_channels: int = 3
    clip_length: int = CLIP_LENGTH
    token_drop: int = TOKEN_DROP
    heads: int = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "heads", self.dim // HEAD_DIM)

    @property
    def chunk(self) -> int:  # latent frames a chunk advances by
        return math.ceil(self.clip_length / self.patch_t)

    @property
    def pre_pad(self) -> int:  # leading output frames of a chunk that pad its clip
        return (-self.clip_length) % self.patch_t

    @property
    def token_overlap(self) -> int:  # latent frames a chunk reads past its own
        return (-self.token_drop) % self.chunk

    @property
    def frame_overlap(self) -> int:  # output frames cross-faded between chunks
        return max(self.token_overlap * self.patch_t - self.pre_pad, 0)


def h3_config(sd: dict, path: str) -> H3Config:
    """The decoder's widths from its weights (and the encoder's, where the file has it, for the compression)."""
    w_in, w_out = sd["decoder.proj_in.weight"], sd.get("decoder.proj_out.weight")
    if w_out is None or w_in.dim() != 2 or w_out.dim() != 2:
        raise FormatError(f"{path}: a MiniMax-H3 VAE without decoder.proj_out.weight", path=path)
    z, dim = w_in.shape[1], w_in.shape[0]
    layers = 1 + max(
        (int(k.split(".")[2]) for k in sd if k.startswith("decoder.transformer_blocks.")), default=-1
    )
    ff = sd.get("decoder.transformer_blocks.0.ff.net.0.proj.weight")
    if layers == 0 or ff is None:
        raise FormatError(f"{path}: a MiniMax-H3 VAE decoder without its transformer blocks", path=path)
    if dim % HEAD_DIM:  # the head width is not in the weights: the release's is the only one known
        raise UnsupportedModel(
            f"{path}: a MiniMax-H3 VAE decoder {dim} wide, not a multiple of the release's 64-wide heads",
            path=path,
        )
    cfg = H3Config(z, dim, layers, sd["decoder.register_tokens"].shape[1], ff.shape[0] // 2)
    if w_out.shape[0] != cfg.image_channels * cfg.patch_t * cfg.patch**2:
        raise UnsupportedModel(
            f"{path}: its decoder makes {w_out.shape[0]} values a voxel, not MiniMax-H3's 3 x 4 x 16 x 16",
            path=path,
        )
    return cfg


def decoder_keys(sd: dict) -> dict:
    """The tensors the decoder reads (the encoder's and `quant_conv`'s: those of an encoder that is not built)."""
    return {k: v for k, v in sd.items() if not k.startswith(("encoder.", "quant_conv."))}


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v = (ops.Linear(dim, dim) for _ in range(3))
        self.to_out = nn.ModuleList([ops.Linear(dim, dim)])

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q, k, v = (f(x).unflatten(2, (self.heads, -1)) for f in (self.to_q, self.to_k, self.to_v))
        q, k = (_rotate(F.rms_norm(t.float(), (t.shape[-1],), eps=EPS).to(t.dtype), rope) for t in (q, k))
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.to_out[0](o.transpose(1, 2).flatten(2))


def _rotate(t: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    cos, sin = (r.to(t.dtype) for r in rope)
    d = cos.shape[-1]
    a, b = t[..., : d // 2], t[..., d // 2 : d]
    turned = torch.cat([-b, a], dim=-1)
    return torch.cat([t[..., :d] * cos + turned * sin, t[..., d:]], dim=-1)


class _SwiGLU(nn.Module):
    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.proj = ops.Linear(dim, 2 * inner)


class _FeedForward(nn.Module):
    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.net = nn.ModuleList([_SwiGLU(dim, inner), nn.Identity(), ops.Linear(inner, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.net[0].proj(x).chunk(2, dim=-1)
        return self.net[2](value * F.silu(gate))


class _Block(nn.Module):
    def __init__(self, cfg: H3Config):
        super().__init__()
        self.norm1, self.norm2 = ops.RMSNorm(cfg.dim, EPS), ops.RMSNorm(cfg.dim, EPS)
        self.attn = _Attention(cfg.dim, cfg.heads)
        self.ff = _FeedForward(cfg.dim, cfg.ffn)
        self.scale1 = nn.Parameter(torch.empty(cfg.dim), requires_grad=False)
        self.scale2 = nn.Parameter(torch.empty(cfg.dim), requires_grad=False)

    def forward(self, x: torch.Tensor, rope, dtype: torch.dtype) -> torch.Tensor:
        x = x + self.attn(_norm32(self.norm1, x).to(dtype), rope) * self.scale1.to(x.device, torch.float32)
        return x + self.ff(_norm32(self.norm2, x).to(dtype)) * self.scale2.to(x.device, torch.float32)


def _norm32(norm: ops.RMSNorm | ops.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """A norm computed in float32 whatever the run's dtype (the release keeps these in float32)."""
    saved, norm.compute_dtype = norm.compute_dtype, None  # the stored weight as float32, not the run's dtype
    try:
        w, b = norm.cast_params(x.float())
    finally:
        norm.compute_dtype = saved
    w = None if w is None else w.float()
    if isinstance(norm, ops.LayerNorm):
        return F.layer_norm(x.float(), norm.normalized_shape, w, None if b is None else b.float(), norm.eps)
    return F.rms_norm(x.float(), (x.shape[-1],), w, norm.eps)


class _Decoder(nn.Module):
    def __init__(self, cfg: H3Config):
        super().__init__()
        self.cfg = cfg
        self.proj_in = ops.Linear(cfg.z, cfg.dim)
        self.register_tokens = nn.Parameter(torch.empty(1, cfg.registers, cfg.dim), requires_grad=False)
        self.transformer_blocks = nn.ModuleList([_Block(cfg) for _ in range(cfg.layers)])
        self.norm_out = ops.LayerNorm(cfg.dim, eps=EPS)
        self.proj_out = ops.Linear(cfg.dim, cfg.image_channels * cfg.patch_t * cfg.patch**2)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """(B, z, T, h, w) -> (B, 3, 4T, 16h, 16w), ImageNet-normalised."""
        cfg, (b, c, t, h, w) = self.cfg, z.shape
        dtype = z.dtype
        x = self.proj_in(z.permute(0, 2, 3, 4, 1).reshape(b, t * h * w, c)).float()
        n = x.shape[1]
        extra = torch.cat(
            [self.register_tokens.to(x.device, x.dtype).expand(b, -1, -1), x.new_zeros(b, 1, cfg.dim)], 1
        )
        x = torch.cat([x, extra], dim=1)
        rope = _rope((t, h, w), cfg.registers + 1, x.device)
        for blk in self.transformer_blocks:
            x = blk(x, rope, dtype)
        y = self.proj_out(_norm32(self.norm_out, x).to(dtype))[:, :n]
        p, pt = cfg.patch, cfg.patch_t
        y = y.reshape(b, t, h, w, cfg.image_channels, pt, p, p).permute(0, 4, 1, 5, 2, 6, 3, 7)
        return y.reshape(b, cfg.image_channels, t * pt, h * p, w * p)


def _rope(sizes, extra: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [1, N + extra, 1, 48]: the voxels' (t, y, x) angles, then `extra` tokens at coordinate 0."""
    dims = int(HEAD_DIM * ROPE_RATIO)
    inv = 1.0 / ROPE_THETA ** torch.arange(0, 1, 2 * 3 / dims, dtype=torch.float32)
    grids = [2.0 * (torch.arange(0.5, s, dtype=torch.float32) / s) - 1.0 for s in sizes]
    pos = torch.stack(torch.meshgrid(*grids, indexing="ij"), dim=-1).flatten(0, 2)
    pos = torch.cat([pos, pos.new_zeros(extra, 3)])
    ang = (2.0 * math.pi * pos[:, :, None] * inv).flatten(1).tile(2)[None, :, None]
    return ang.cos().to(device), ang.sin().to(device)


class MiniMaxH3VAE(nn.Module):
    """MiniMax-H3's video VAE under diffusers' module names: the decoder, and the encoder where `enc` is given (a
    file without one only decodes: no `encoder` attribute, which engine.vae.run reads as decode-only)."""

    video = True
    own_driver = True  # engine.vae.run hands it the whole latent (decode_clips), not decode_head / decode_up
    image_range = (-1.0, 1.0)

    def __init__(self, cfg: H3Config, enc=None):
        super().__init__()
        self.cfg = cfg
        self.latent_channels, self.downscale, self.time_factor = cfg.z, cfg.patch, cfg.patch_t
        if enc is not None:  # a minimax_h3_encoder.EncoderConfig
            from .minimax_h3_encoder import Encoder

            self.encoder = Encoder(enc)
            self.quant_conv = ops.Conv3d(2 * cfg.z, 2 * cfg.z, 1)
        self.post_quant_conv = ops.Conv3d(cfg.z, cfg.z, 1)
        self.decoder = _Decoder(cfg)

    def vae_spec(self):
        """The memory estimate's view of it (engine.vae.estimate.vit_video_bytes)."""
        from .estimate import VaeSpec

        wbytes = sum(
            p.numel() * p.element_size() for p in self.parameters()
        )  # the encoder's too, where built
        enc = self.encoder.conv_in.out_channels if hasattr(self, "encoder") else 0
        c = self.cfg
        return VaeSpec("minimax_h3", c.z, wbytes, c.dim, c.dim, c.patch_t, c.patch, enc_ch=enc)

    def frames_out(self, latent_frames: int) -> int:
        cfg = self.cfg
        return vit_frames(latent_frames, cfg.clip_length, cfg.token_drop, cfg.patch_t)

    def decode(
        self, z: torch.Tensor, tile: tuple[int, int] | None = (TILE_PX, TILE_OVERLAP_PX)
    ) -> torch.Tensor:
        """(B, z, T, h, w) -> (B, 3, F, H, W) in [-1, 1] (not clamped), as the release decodes it."""
        return self.decode_clips(z, tile)

    def encode(
        self, x: torch.Tensor, tile: tuple[int, int] | None = (TILE_PX, TILE_OVERLAP_PX)
    ) -> torch.Tensor:
        """(B, 3, F, H, W) in [-1, 1] -> the posterior's mean (B, z, T, H/16, W/16), as the release encodes it
        (engine.vae.minimax_h3_encoder): T = 1 for one frame, 5 ceil(F / 17) - 3 for F > 1."""
        if not hasattr(self, "encoder"):
            raise UnsupportedModel(
                "this MiniMax-H3 VAE file holds no encoder (or one of unknown GroupNorm groups)"
            )
        from .minimax_h3_encoder import encode

        return encode(self, x, tile)

    def decode_clips(self, z: torch.Tensor, tile=(TILE_PX, TILE_OVERLAP_PX), on_tile=None) -> torch.Tensor:
        """The release's decode: chunks of latent frames, each whole or in `tile` (px, min overlap px) tiles,
        cross-faded in time. `on_tile(chunk, chunks, index, count, rect)` after each tile."""
        cfg = self.cfg
        t = z.shape[2]
        starts, pad = _frame_plan(cfg, t)
        if not starts:  # e.g. 2 latent frames: with the 3 the encoder dropped, not one whole chunk
            raise UnsupportedModel(
                f"MiniMax-H3's VAE decodes its latents in chunks of {cfg.chunk} frames, of which the encoder dropped "
                f"{cfg.token_drop}: {t} latent frames make none (its latents have {cfg.chunk}n + {cfg.chunk - cfg.token_drop} frames)"
            )
        if pad:
            z = torch.cat([z, z[:, :, -1:].expand(-1, -1, pad, -1, -1)], dim=2)
        span, keep = cfg.chunk * cfg.patch_t, cfg.pre_pad
        b, f = z.shape[0], cfg.patch
        frames = self.frames_out(t)
        # frame-major storage (what the run hands on), written chunk by chunk: no list of parts joined at the end
        video = torch.empty(b, frames, cfg.image_channels, z.shape[-2] * f, z.shape[-1] * f).transpose(1, 2)
        at, carry = 0, None
        for i, s in enumerate(starts):
            zc = z[:, :, s : s + cfg.chunk + cfg.token_overlap]
            clip = self._clip(zc, tile, lambda *a, i=i: on_tile and on_tile(i, len(starts), *a))
            head = clip[:, :, keep:span]
            if carry is not None:
                head = _blend(carry, head, cfg.frame_overlap, 2)
            at = _put(video, head, at)
            carry = clip[:, :, span + keep : 2 * span].clone() if cfg.token_drop > 0 else None
            del clip, head
        if carry is not None:
            _put(video, carry, at)
        mean = torch.tensor(IMAGENET_MEAN)[None, :, None, None, None]
        std = torch.tensor(IMAGENET_STD)[None, :, None, None, None]
        return video.mul_(std).add_(mean).mul_(2).sub_(1)

    def _clip(self, z: torch.Tensor, tile, on_tile) -> torch.Tensor:
        """One chunk's frames, (B, 3, 4 T, H, W) float32 on the CPU: whole, or tile by tile, each row of tiles
        blended into the one above (kept raw until the next row is done) and written in place."""
        f = self.cfg.patch
        h, w = z.shape[-2] * f, z.shape[-1] * f
        if tile is None:
            y = self.decoder(self.post_quant_conv(z)).float().cpu()
            on_tile(0, 1, (0, h, 0, w))
            return y
        ys, xs = split_tiles(h, *tile, f), split_tiles(w, *tile, f)
        out, above, count = None, None, len(ys[0]) * len(xs[0])
        for a, (y0, ly) in enumerate(zip(ys[0], ys[1], strict=True)):
            row = []
            for c, (x0, lx) in enumerate(zip(xs[0], xs[1], strict=True)):
                part = z[..., y0 // f : (y0 + ly) // f, x0 // f : (x0 + lx) // f]
                row.append(self.decoder(self.post_quant_conv(part)).float().cpu())
                on_tile(a * len(xs[0]) + c, count, (y0, y0 + ly, x0, x0 + lx))
            if out is None:
                out = torch.empty(*row[0].shape[:3], h, w)
            for c, x0 in enumerate(xs[0]):
                t = _stitched(row, above, c, ys[2][a - 1] if a else 0, xs[2][c - 1] if c else 0)
                t = t[..., : t.shape[-2] - (ys[2][a] if a < len(ys[2]) else 0), :]
                t = t[..., : t.shape[-1] - (xs[2][c] if c < len(xs[2]) else 0)]
                out[..., y0 : y0 + t.shape[-2], x0 : x0 + t.shape[-1]] = t
            above = row
        return out


def _put(video: torch.Tensor, part: torch.Tensor, at: int) -> int:
    """`part`'s frames into `video` from frame `at`, as many as it has room for (the frames the padding made are
    past its end); the next frame's index."""
    n = max(0, min(part.shape[2], video.shape[2] - at))
    video[:, :, at : at + n] = part[:, :, :n]
    return at + part.shape[2]


def _frame_plan(cfg: H3Config, t: int) -> tuple[list[int], int]:
    """The chunks' first latent frames, and the latent frames padded on to make whole chunks."""
    tokens = t + cfg.token_drop
    pad = (-tokens) % cfg.chunk
    n = (tokens + pad) // cfg.chunk - int(cfg.token_drop > 0)
    return [i * cfg.chunk for i in range(max(0, n))], pad


def _pad_frames(cfg: H3Config, t: int, pad: int) -> int:
    """Output frames made by the `pad` repeated latent frames: a chunk's last latent frame covers
    clip_length mod 4 frames, the others 4."""
    tail = cfg.clip_length % cfg.patch_t
    return sum(tail if tail and (t + k) % cfg.chunk == 0 else cfg.patch_t for k in range(pad))


def _blend(a: torch.Tensor, b: torch.Tensor, extent: int, dim: int) -> torch.Tensor:
    """b with its first `extent` entries along `dim` ramped linearly from a's last ones."""
    extent = min(a.shape[dim], b.shape[dim], extent)
    if extent == 0:
        return b
    shape = [1] * b.dim()
    shape[dim] = extent
    r = (torch.arange(extent, dtype=b.dtype) / extent).view(shape)
    mixed = a.narrow(dim, a.shape[dim] - extent, extent) * (1 - r) + b.narrow(dim, 0, extent) * r
    return torch.cat([mixed, b.narrow(dim, extent, b.shape[dim] - extent)], dim=dim)


def _stitched(
    row: list[torch.Tensor], above: list[torch.Tensor] | None, c: int, oy: int, ox: int
) -> torch.Tensor:
    """Tile `c` of `row` blended into the raw tile above over `oy` rows, then into the raw tile to its left over
    `ox` columns (the release's order)."""
    t = row[c]
    if above is not None:
        t = _blend(above[c], t, oy, -2)
    if c > 0:
        t = _blend(row[c - 1], t, ox, -1)
    return t
