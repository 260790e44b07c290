"""The Wan-family video VAE — Wan 2.1 (also Qwen-Image's, Wan 2.2 A14B's) and Wan 2.2's 48-channel one —
built from castable ops in the original codebase's module names, so ComfyUI's repackaged files load as
they are and diffusers-named files are renamed onto them (engine.vae.wan_loading).

Architecture facts (Wan-Video/Wan2.1 `wan/modules/vae.py`, Wan2.2 `wan/modules/vae2_2.py`; the same
network as diffusers' AutoencoderKLWan / AutoencoderKLQwenImage):
  * every convolution is a causal 3-D convolution: zero padding on both sides in space and 2 * pad frames
    before the clip only in time; RMS norms over channels with a learned `gamma`, SiLU;
  * ResidualBlock = residual.{0 norm, 2 conv 3x3x3, 3 norm, 6 conv 3x3x3} plus a 1x1x1 `shortcut` when
    the width changes; the middle block = residual, single-head attention within each frame (`to_qkv`,
    `proj` 1x1 convs), residual;
  * Resample: spatial x2 (nearest, then a 3x3 conv; Wan 2.1 halves the width there) per frame, and where
    the level is temporal a `time_conv` (3, 1, 1) that turns every frame after the clip's first into two
    (the first frame passes alone: T latent frames decode to 1 + 4 (T - 1)); downsampling zero-pads
    (0, 1, 0, 1) and strides 2, the temporal one folding frame pairs after the first;
  * Wan 2.2 adds parameter-free shortcuts around each level (AvgDown3D: the space-time patches'
    channel groups averaged; DupUp3D: channels duplicated into the patch, the first frame trimmed at the
    clip's start) and works on 2x2-patchified pixels (12 channels), so its latents are 16x smaller.
  * Qwen-Image 2.1's image VAE is Wan 2.2's residual network with 2-D convolutions, z 64, RGBA, no
    patchify: `WanConfig.frame` makes every 3x3x3 convolution 1x3x3 (engine.vae.qwen_image21 lists what differs).

Causality is what makes chunked decoding exact: each causal conv keeps the last input frames it saw in a
`Stream` (one per clip and per spatial tile), so a clip decoded chunk by chunk equals the whole pass.
The original decodes one latent frame at a time with such a cache; any chunk size gives the same result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..memory import trim_heap
from .autoencoder_kl import attention
from .causal_conv import CausalConv3d, Stream, VideoShape

# Free heap bytes above which a resample (a level boundary) hands the heap's free pages back first, on the
# CPU. Under glibc's 32 MiB mmap ceiling a tile's lower levels live on the heap; freed, they stay
# resident under the next level's mmapped tensors (at 832x480, 512-px tiles: ~190 MB of a 400 MB
# peak). A trim is a few ms per level boundary; the tiled peak went 404 -> 305 MB, the time unchanged.
LEVEL_TRIM_SLACK = 16 << 20

# Input frames per convolution call in the residual blocks and the head (CausalConv3d.sliced).
SLICE_FRAMES = 1


def _layout_2d(y: torch.Tensor) -> torch.memory_format:
    """The layout a per-frame result keeps (channels-last where the convolution gave it)."""
    if y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def _per_frame(fn, x: torch.Tensor) -> torch.Tensor:
    """Apply a 2-D op to every frame of (B, C, T, H, W)."""
    b, c, t, h, w = x.shape
    y = fn(x.transpose(1, 2).reshape(b * t, c, h, w))
    return y.reshape(b, t, *y.shape[1:]).transpose(1, 2)


class _Indexed(nn.Module):
    """A container whose children are named '0', '2', ... as the original nn.Sequential numbered them
    (parameter-free layers such as SiLU and Dropout left out)."""

    def __init__(self, items: dict[int, nn.Module]):
        super().__init__()
        for i, m in items.items():
            self.add_module(str(i), m)

    def __getitem__(self, i: int) -> nn.Module:
        return self._modules[str(i)]


def conv3(cin: int, cout: int, frame: bool = False) -> CausalConv3d:
    """A 3x3x3 causal convolution, or with `frame` (Qwen-Image 2.1's 2-D network) a 1x3x3 one: no history,
    the same sums as its nn.Conv2d on each frame."""
    return (
        CausalConv3d(cin, cout, (1, 3, 3), padding=(0, 1, 1))
        if frame
        else CausalConv3d(cin, cout, 3, padding=1)
    )


class ResidualBlock(nn.Module):
    def __init__(self, cin: int, cout: int, frame: bool = False):
        super().__init__()
        self.residual = _Indexed(
            {
                0: ops.ChannelRMSNorm(cin),
                2: conv3(cin, cout, frame),
                3: ops.ChannelRMSNorm(cout),
                6: conv3(cout, cout, frame),
            }
        )
        self.shortcut = CausalConv3d(cin, cout, 1) if cin != cout else None

    def step(self, x: torch.Tensor, stream: Stream | None) -> torch.Tensor:
        r = self.residual
        # A slice of frames at a time, the second convolution over its own input (CausalConv3d.sliced):
        # x, h and one slice's buffers at most
        h = r[2].sliced(x, stream, r[0], SLICE_FRAMES)
        h = r[6].sliced(h, stream, r[3], SLICE_FRAMES, inplace=True)
        if self.shortcut is not None:
            x = self.shortcut.step(x, stream)
        # In place on the convolution's fresh output (the same sum: addition commutes bit for bit): one
        # block-sized tensor fewer at once, and the result keeps the convolution's layout.
        h += x
        return h


class AttentionBlock(nn.Module):
    """Single-head self-attention over the pixels of each frame (no attention across frames)."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = ops.ChannelRMSNorm(dim, spatial_dims=2)
        self.to_qkv = ops.Conv2d(dim, 3 * dim, 1)
        self.proj = ops.Conv2d(dim, dim, 1)

    def frame(self, x: torch.Tensor) -> torch.Tensor:  # (N, C, H, W)
        n, c, h, w = x.shape
        qkv = self.to_qkv(self.norm(x)).reshape(n, 3 * c, h * w).transpose(1, 2)
        q, k, v = qkv.chunk(3, dim=-1)
        del qkv
        # score rows in chunks of 8 MiB: at 720p a frame is 14,400 tokens, and the middle block runs
        # whole while the tiles around it are small
        a = attention(q.contiguous(), k.contiguous(), v.contiguous(), max_score_bytes=8 << 20)
        return x + self.proj(a.transpose(1, 2).reshape(n, c, h, w))

    def step(self, x: torch.Tensor, stream: Stream | None = None) -> torch.Tensor:
        return torch.cat([_per_frame(self.frame, x[:, :, i : i + 1]) for i in range(x.shape[2])], dim=2)


class Resample(nn.Module):
    """`mode`: up2d, up3d, down2d or down3d; `cout` the spatial conv's output width."""

    def __init__(self, dim: int, mode: str, cout: int, frame: bool = False):
        super().__init__()
        self.mode = mode
        stride = 2 if mode.startswith("down") else 1
        self.resample = _Indexed(
            {1: ops.Conv2d(dim, cout, 3, stride=stride, padding=0 if stride == 2 else 1)}
        )
        # `frame`: Qwen-Image 2.1's time_convs are 1x1 (never run: a single frame passes them by)
        if mode == "up3d":
            self.time_conv = (
                CausalConv3d(dim, 2 * dim, 1)
                if frame
                else CausalConv3d(dim, 2 * dim, (3, 1, 1), padding=(1, 0, 0))
            )
        elif mode == "down3d":
            self.time_conv = (
                CausalConv3d(dim, dim, 1) if frame else CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1))
            )

    def _space(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.resample[1]
        if self.mode.startswith("up"):
            # Nearest x2 in one op (the original's nn.Upsample "nearest-exact": pixel i <- i // 2, a copy):
            # two repeat_interleave calls held a 2x and a 4x copy at once and lost the channels-last
            # layout, so the convolution reordered its largest input. Frame by frame into one output:
            # the upsampled input (twice the output's size at Wan 2.1's halved width) is then one
            # frame's, not the chunk's -- it was the tiled decode's peak.
            out = None
            for i in range(x.shape[0]):
                y = conv(F.interpolate(x[i : i + 1], scale_factor=2.0, mode="nearest-exact"))
                if out is None:
                    out = torch.empty((x.shape[0], *y.shape[1:]), dtype=y.dtype, device=y.device,
                                      memory_format=_layout_2d(y))  # fmt: skip
                out[i : i + 1] = y
                del y
            return out
        return conv(F.pad(x, (0, 1, 0, 1)))

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        if x.device.type == "cpu":
            trim_heap(LEVEL_TRIM_SLACK)
        if self.mode == "up3d":
            x = self._time_up(x, stream)
        x = _per_frame(self._space, x)
        if self.mode == "down3d":
            x = self._time_down(x, stream)
        return x

    def _time_up(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        first = None
        if id(self) not in stream.started:  # the clip's first frame is not doubled
            stream.started.add(id(self))
            first, x = x[:, :, :1], x[:, :, 1:]
        if x.shape[2]:
            b, c, t, h, w = x.shape
            y = self.time_conv.step(x, stream).reshape(b, 2, c, t, h, w)
            x = torch.stack((y[:, 0], y[:, 1]), dim=3).reshape(b, c, 2 * t, h, w)
            del y
        return x if first is None else torch.cat([first, x], dim=2) if x.shape[2] else first

    def _time_down(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        key = id(self)
        prev = stream.frames.get(key)
        if stream.keep:
            stream.frames[key] = x[:, :, -1:].clone()
        else:
            stream.frames.pop(key, None)
        if prev is None:  # the first chunk (one frame) passes
            return x
        return self.time_conv.step(torch.cat([prev, x], dim=2), None)


def avg_down(x: torch.Tensor, cout: int, ft: int, fs: int) -> torch.Tensor:
    """Wan 2.2's AvgDown3D shortcut: fold each ft x fs x fs patch into channels (zero frames in front when
    T is not a multiple of ft), then average groups of channels down to `cout`."""
    x = F.pad(x, (0, 0, 0, 0, (-x.shape[2]) % ft, 0))
    b, c, t, h, w = x.shape
    x = x.reshape(b, c, t // ft, ft, h // fs, fs, w // fs, fs).permute(0, 1, 3, 5, 7, 2, 4, 6)
    x = x.reshape(b, cout, c * ft * fs * fs // cout, t // ft, h // fs, w // fs)
    return x.mean(dim=2)


def add_dup_up(out: torch.Tensor, x: torch.Tensor, ft: int, fs: int, first: bool) -> torch.Tensor:
    """Wan 2.2's DupUp3D shortcut added into `out`, in place: x's channels repeated then unfolded into
    ft x fs x fs patches (channel k of the repeat lands at patch position k mod ft*fs*fs, in (frame, row,
    column) order), the first ft - 1 frames dropped at the clip's start. Never built as a tensor of its own
    (the level's output size, held across the whole level it was the Wan 2.2 decode's peak): for each
    patch position, the channels that land there are added to out's strided view -- each element is
    out's value plus a copy of one of x's, the sum of adding the built tensor."""
    b, c, t, h, w = x.shape
    cout = out.shape[1]
    n = cout * ft * fs * fs
    src = (torch.arange(n, device=x.device) // (n // c)).reshape(cout, ft, fs, fs)  # dup_up's channel order
    skip = ft - 1 if first else 0
    for a in range(ft):
        t0 = 1 if a < skip else 0  # the clip's first latent frame keeps only its last phase
        o0 = t0 * ft + a - skip
        for p in range(fs):
            for q in range(fs):
                out[:, :, o0::ft, p::fs, q::fs] += x[:, :, t0:].index_select(1, src[:, a, p, q])
    return out


class Level(nn.Module):
    """Wan 2.2's residual level: blocks then a resample under `downsamples.N` / `upsamples.N`, with a
    parameter-free patch shortcut around them."""

    def __init__(self, name: str, items: list[nn.Module], cin: int, cout: int, ft: int, fs: int):
        super().__init__()
        setattr(self, name, _Indexed(dict(enumerate(items))))
        self._name, self.cin, self.cout, self.ft, self.fs = name, cin, cout, ft, fs

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        inner: _Indexed = getattr(self, self._name)
        down = self._name == "downsamples"
        short = avg_down(x, self.cout, self.ft, self.fs) if down else None
        first = id(self) not in stream.started
        stream.started.add(id(self))
        y = x
        for m in inner._modules.values():
            y = m.step(y, stream)
        if down:
            return y + short
        # The up shortcut from the level's input, kept instead of its built tensor (8x the input when
        # the level doubles time), added into the fresh output
        return add_dup_up(y, x, self.ft, self.fs, first) if self.fs > 1 else y


class Middle(nn.Module):
    def __init__(self, dim: int, frame: bool = False):
        super().__init__()
        self.add_module("0", ResidualBlock(dim, dim, frame))
        self.add_module("1", AttentionBlock(dim))
        self.add_module("2", ResidualBlock(dim, dim, frame))

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        for m in self._modules.values():
            x = m.step(x, stream)
        return x


class Head(nn.Module):
    def __init__(self, cin: int, cout: int, frame: bool = False):
        super().__init__()
        self.add_module("0", ops.ChannelRMSNorm(cin))
        self.add_module("2", conv3(cin, cout, frame))

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        return self._modules["2"].step(x, stream, norm=self._modules["0"], frames=SLICE_FRAMES)


@dataclass(frozen=True)
class WanConfig:
    """What the weights say: widths per level, where time is resampled, the latent and patch size."""

    z: int
    enc_dims: tuple[int, ...]  # conv1 width, then each level's output width (() without an encoder)
    dec_dims: tuple[int, ...]  # decoder.conv1 width, then each level's output width
    temporal: tuple[bool, ...]  # per decoder level that upsamples: does it double the frames
    num_res_blocks: int = 2
    residual: bool = False  # Wan 2.2's nested levels with patch shortcuts
    patch: int = 1  # 2 for Wan 2.2 (12-channel pixels)
    image_channels: int = 3  # per pixel after unpatchify (4 for Qwen-Image-Layered's RGBA VAE)
    has_encoder: bool = True
    has_decoder: bool = True
    frame: bool = False  # 2-D convolutions, single images (Qwen-Image 2.1: engine.vae.qwen_image21)

    @property
    def downscale(self) -> int:
        return 2 ** (len(self.dec_dims) - 2) * self.patch

    @property
    def time_factor(self) -> int:
        return 1 if self.frame else 2 ** sum(self.temporal)


class Encoder3d(nn.Module):
    def __init__(self, cfg: WanConfig):
        super().__init__()
        dims = cfg.enc_dims
        pix = cfg.image_channels * cfg.patch**2
        fr = cfg.frame
        self.conv1 = conv3(pix, dims[0], fr)
        t_down = cfg.temporal[::-1]
        levels = len(dims) - 1
        flat: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            down = i != levels - 1
            items: list[nn.Module] = [
                ResidualBlock(a if j == 0 else b, b, fr) for j in range(cfg.num_res_blocks)
            ]
            mode = ("down3d" if t_down[i] else "down2d") if down else None
            if mode:
                items.append(Resample(b, mode, b, fr))
            if cfg.residual:
                ft = 2 if mode == "down3d" else 1
                flat.append(Level("downsamples", items, a, b, ft, 2 if down else 1))
            else:
                flat += items
        self.downsamples = _Indexed(dict(enumerate(flat)))
        self.middle = Middle(dims[-1], fr)
        self.head = Head(dims[-1], 2 * cfg.z, fr)

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        x = self.conv1.step(x, stream)
        for m in self.downsamples._modules.values():
            x = m.step(x, stream)
        return self.head.step(self.middle.step(x, stream), stream)


class Decoder3d(nn.Module):
    def __init__(self, cfg: WanConfig):
        super().__init__()
        dims = cfg.dec_dims
        fr = cfg.frame
        self.conv1 = conv3(cfg.z, dims[0], fr)
        self.middle = Middle(dims[0], fr)
        levels = len(dims) - 1
        flat: list[nn.Module] = []
        cin = dims[0]
        for i, b in enumerate(dims[1:]):
            up = i != levels - 1
            mode = ("up3d" if cfg.temporal[i] else "up2d") if up else None
            items: list[nn.Module] = [
                ResidualBlock(cin if j == 0 else b, b, fr) for j in range(cfg.num_res_blocks + 1)
            ]
            # Wan 2.1's upsampling conv halves the width; Wan 2.2's keeps it
            out = b if cfg.residual else b // 2
            if mode:
                items.append(Resample(b, mode, out, fr))
            if cfg.residual:
                flat.append(Level("upsamples", items, cin, b, 2 if mode == "up3d" else 1, 2 if up else 1))
            else:
                flat += items
            cin = out if mode else b
        self.upsamples = _Indexed(dict(enumerate(flat)))
        self.head = Head(dims[-1], cfg.image_channels * cfg.patch**2, fr)

    def head_step(self, z: torch.Tensor, stream: Stream) -> torch.Tensor:
        """conv1 and the middle block: at latent resolution, attention over each whole frame."""
        return self.middle.step(self.conv1.step(z, stream), stream)

    def up_step(self, x: torch.Tensor, stream: Stream, frames_at_once: int | None = None) -> torch.Tensor:
        """The up path. After the last temporal upsample every op is causal-with-cache or per frame, so
        the full-resolution levels may run `frames_at_once` frames at a time (exactly the same result):
        their activations, the largest of the pass, are then those of one frame, not of four. None: all
        at once -- the default: between frame groups every causal convolution keeps its two history
        frames, which at a 5-frame chunk of a 512-px tile outweighs what the smaller groups save (CPU,
        832x480, width 16: 228 MB all at once, 344 MB one frame at a time)."""
        mods = list(self.upsamples._modules.values())
        last_t = max((i for i, m in enumerate(mods) if _doubles_time(m)), default=-1)
        for m in mods[: last_t + 1]:
            x = m.step(x, stream)
        rest = mods[last_t + 1 :]
        if frames_at_once is None or x.shape[2] <= frames_at_once:
            for m in rest:
                x = m.step(x, stream)
            return self.head.step(x, stream)
        outs, keep = [], stream.keep
        for a in range(0, x.shape[2], frames_at_once):
            stream.keep = keep or a + frames_at_once < x.shape[2]  # the next frames read this one's
            y = x[:, :, a : a + frames_at_once]
            for m in rest:
                y = m.step(y, stream)
            outs.append(self.head.step(y, stream))
        stream.keep = keep
        del x
        return torch.cat(outs, dim=2)


def _doubles_time(m: nn.Module) -> bool:
    """A flat-layout Resample or a Wan 2.2 level (whose modules include one) that upsamples time."""
    return any(isinstance(r, Resample) and r.mode == "up3d" for r in m.modules())


def unpatchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """(B, C p p, T, H, W) -> (B, C, T, H p, W p); channel c*p*p + pw*p + ph holds pixel (ph, pw) of the
    patch (Wan2.2 vae2_2.py: rearrange 'b (c r q) f h w -> b c f (h q) (w r)')."""
    if p == 1:
        return x
    b, cpp, t, h, w = x.shape
    x = x.reshape(b, cpp // (p * p), p, p, t, h, w).permute(0, 1, 4, 5, 3, 6, 2)
    return x.reshape(b, cpp // (p * p), t, h * p, w * p)


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    if p == 1:
        return x
    b, c, t, h, w = x.shape
    x = x.reshape(b, c, t, h // p, p, w // p, p).permute(0, 1, 6, 4, 2, 3, 5)
    return x.reshape(b, c * p * p, t, h // p, w // p)


class WanVAE(VideoShape, nn.Module):
    """`decode` takes VAE-space latents (B, z, T, h, w) and returns clips (B, 3, 1 + 4 (T - 1), H, W) in
    [-1, 1]; `encode` the posterior mean of clips of 1 + 4k frames. `conv1` / `conv2` are the quant and
    post-quant 1x1x1 convolutions of the original file."""

    kind = "vae"
    video = True
    image_range = (-1.0, 1.0)

    def __init__(self, cfg: WanConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.has_encoder:
            self.encoder = Encoder3d(cfg)
            self.conv1 = CausalConv3d(2 * cfg.z, 2 * cfg.z, 1)
        if cfg.has_decoder:
            self.conv2 = CausalConv3d(cfg.z, cfg.z, 1)
            self.decoder = Decoder3d(cfg)

    # -- pieces the chunked runner composes (engine.vae.video) ----------------------------------
    def decode_head(self, z: torch.Tensor, stream: Stream) -> torch.Tensor:
        return self.decoder.head_step(self.conv2.step(z, None), stream)

    def decode_up(self, h: torch.Tensor, stream: Stream, frames_at_once: int | None = None) -> torch.Tensor:
        return unpatchify(self.decoder.up_step(h, stream, frames_at_once), self.cfg.patch)

    # -- whole passes ----------------------------------------------------------------------------
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Whole-clip decode, chunk by chunk in latent frames (any chunking gives the same result)."""
        head, up = Stream(), Stream()
        out = [self.decode_up(self.decode_head(z[:, :, i : i + 1], head), up) for i in range(z.shape[2])]
        return torch.cat(out, dim=2).clamp_(-1, 1)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Clip (B, C, 1 + 4k, H, W) in [-1, 1] -> latent mean (B, z, 1 + k, H/f, W/f); frames in chunks
        of 1, 4, 4, ... as the original runs them (Wan 2.2's shortcuts pad each chunk on its own)."""
        x = patchify(x, self.cfg.patch)
        stream = Stream()
        t = x.shape[2]
        bounds = [0, 1, *range(5, t + 1, 4)]
        outs = [self.encoder.step(x[:, :, a:b], stream) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        mu = self.conv1.step(torch.cat(outs, dim=2), None)
        return mu[:, : self.cfg.z]
