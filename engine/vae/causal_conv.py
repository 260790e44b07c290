"""The Wan VAE's causal 3-D convolution and the state that makes chunked decoding exact.

Every convolution of the Wan-family VAEs (engine.vae.wan) is causal in time: zero padding on both sides
in space, and 2 * pad frames of history before the clip only in time. Other video VAEs pad by replication
(`pad="replicate"`: at the clip's start the history frames are copies of its first frame, and the spatial
borders copies of the edge rows and columns, as `F.pad(mode="replicate")` gives -- the HunyuanVideo and
CogVideoX-style causal convolutions of diffusers' autoencoder_kl_hunyuan_video.py and
autoencoder_kl_mochi.py; `pad="replicate_time"`: the history only, zero spatial borders, as LTX-Video's
causal convolutions in autoencoder_kl_ltx.py). Each keeps the last input frames it
saw in a `Stream` (one per clip and per spatial tile), so a clip decoded chunk by chunk equals the whole
pass. On the CPU the padded input is channels-last and oneDNN is called directly (see `_onednn`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import ops


class Stream:
    """The causal state of one clip (or one spatial tile of it): per causal conv the last input frames it
    saw, and which temporal resamples have passed the clip's first frame. Entries are replaced, never
    mutated, so `copy()` is a cheap snapshot to retry a chunk from. `keep` False: nothing runs after
    this part of the clip, so the convolutions keep no frames (at 832x480 they are a third of a tile's
    peak)."""

    def __init__(self) -> None:
        self.frames: dict[int, torch.Tensor] = {}
        self.started: set[int] = set()
        self.keep = True

    def copy(self) -> Stream:
        s = Stream()
        s.frames, s.started, s.keep = dict(self.frames), set(self.started), self.keep
        return s


PADS = ("zeros", "replicate", "replicate_time")


class VideoShape:
    """Mixin of the video VAEs: what the chunk driver (engine.vae.video) and the run read of one, from its
    config's `z`, `downscale` and `time_factor`."""

    @property
    def latent_channels(self) -> int:
        return self.cfg.z

    @property
    def downscale(self) -> int:
        return self.cfg.downscale

    @property
    def time_factor(self) -> int:
        return self.cfg.time_factor


class CausalConv3d(ops.Conv3d):
    """A 3-D convolution, causal in time: `2 * padding[0]` frames of history (at the clip's start zeros, or
    copies of its first frame where `pad` replicates; the stream's cached frames after) instead of
    symmetric padding; `padding[1:]` rows and columns of zeros on each side, or of edge copies where
    `pad` is "replicate"."""

    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0, pad: str = "zeros"):
        super().__init__(cin, cout, kernel, stride=stride, padding=0)
        if pad not in PADS:
            raise ValueError(f"pad {pad!r}: one of {PADS}")
        pt, ph, pw = (padding,) * 3 if isinstance(padding, int) else padding
        self.history = 2 * pt
        self.space_pad = (pw, pw, ph, ph)
        self.replicate_time = pad != "zeros"
        self.replicate_space = pad == "replicate"

    def _conv_forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if _onednn(x):
            return torch.mkldnn_convolution(x, w, b, self.padding, self.stride, self.dilation, self.groups)
        return super()._conv_forward(x, w, b)

    def step(
        self,
        x: torch.Tensor,
        stream: Stream | None,
        norm: ops.ChannelRMSNorm | None = None,
        frames: int | None = None,
    ) -> torch.Tensor:
        """`norm`: convolve SiLU(norm(x)), computed straight into the padded buffer (the pre-activation
        of every convolution in a residual block and the head), so it is never a tensor of its own.
        `frames`: convolve that many input frames at a time (see `sliced`)."""
        if frames is not None and self.history and x.shape[2] > frames:
            return self.sliced(x, stream, norm, frames)
        return self(self.pad(x, stream, norm))

    def sliced(
        self,
        x: torch.Tensor,
        stream: Stream | None,
        norm: ops.ChannelRMSNorm | None = None,
        frames: int = 1,
        *,
        inplace: bool = False,
    ) -> torch.Tensor:
        """The convolution `frames` input frames at a time through one rolling padded buffer of
        history + `frames` frames, written into one output: the same sums as the whole convolution (as
        between chunks, each output frame reads the same padded frames). The buffer is then a slice's,
        not the chunk's plus its history: at one frame, 3 frames of input instead of T + 2. After each
        slice the buffer's last `history` frames move to its front, the next slice's history, so no
        frames are cloned on the way. `inplace` (cout == cin, x not needed after): each slice's output
        overwrites its own input frames, already read into the buffer -- a residual block then holds
        x, h and one slice, not x, a padded h and h's convolution."""
        hist, (n, _, t, _, _) = self.history, x.shape
        buf, inner = self._buffer(x, frames, stream)
        start = self._at_start(stream)
        out = x if inplace else None
        for a in range(0, t, frames):
            k = min(t, a + frames) - a
            if norm is not None:
                norm.silu_into(x[:, :, a : a + k], inner[:, :, hist : hist + k])
            else:
                inner[:, :, hist : hist + k] = x[:, :, a : a + k]
            self._replicate(buf[:, :, : hist + k], inner, start and a == 0)
            y = self(buf[:, :, : hist + k])
            if out is None:
                out = torch.empty((n, y.shape[1], t, *y.shape[3:]), dtype=y.dtype, device=y.device,
                                  memory_format=_conv_layout(y))  # fmt: skip
            out[:, :, a : a + k] = y
            del y
            for i in range(hist):  # frame by frame, front first: the copies never overlap
                inner[:, :, i] = inner[:, :, k + i]
        self._carry(stream, inner[:, :, :hist])
        return out

    def pad(
        self, x: torch.Tensor, stream: Stream | None, norm: ops.ChannelRMSNorm | None = None
    ) -> torch.Tensor:
        """What this convolution convolves: x (or SiLU(norm(x))) with its history frames and zero borders,
        the stream updated (what `step` convolves when it takes the chunk whole)."""
        hist, (pl, pr, pt, pb) = self.history, self.space_pad
        if norm is not None and not (hist or pl or pr or pt or pb):
            x = F.silu(norm(x), inplace=True)
            norm = None
        if hist or pl or pr or pt or pb:
            # History frames and zero borders in one buffer, x copied in once (a cat and then a pad
            # held two copies of the chunk's input at once)
            buf, inner = self._buffer(x, x.shape[2], stream)
            start = self._at_start(stream)
            if norm is not None:
                norm.silu_into(x, inner[:, :, hist:])
            else:
                inner[:, :, hist:] = x
            self._replicate(buf, inner, start)
            self._carry(stream, inner[:, :, inner.shape[2] - hist :])
            del inner
            x = buf
        return x

    def _buffer(
        self, x: torch.Tensor, frames: int, stream: Stream | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A zeroed buffer for the history and `frames` frames of x's size with their zero borders (the
        layout of _conv_layout), the stream's last frames in its history; and its inside (no borders)."""
        hist, (pl, pr, pt, pb) = self.history, self.space_pad
        n, c, _, h, w = x.shape
        buf = torch.empty(n, c, hist + frames, pt + h + pb, pl + w + pr, dtype=x.dtype, device=x.device,
                          memory_format=_conv_layout(x)).zero_()  # fmt: skip
        inner = buf[:, :, :, pt : pt + h, pl : pl + w]
        prev = stream.frames.get(id(self)) if stream is not None and hist else None
        if prev is not None:
            inner[:, :, :hist] = prev
        return buf, inner

    def _at_start(self, stream: Stream | None) -> bool:
        """Whether this call convolves the clip's first frame (no history in the stream)."""
        return bool(self.history) and (stream is None or id(self) not in stream.frames)

    def _replicate(self, buf: torch.Tensor, inner: torch.Tensor, start: bool) -> None:
        """The replicated padding of `buf` (the frames to convolve), its inside written: at the clip's
        start the history frames become copies of the first frame, then (time first, so the corners are
        edge copies of edge copies, as F.pad's) the border rows and columns copies of the edge ones."""
        hist = self.history
        if start and self.replicate_time:
            inner[:, :, :hist] = inner[:, :, hist : hist + 1]
        if not self.replicate_space:
            return
        pl, pr, pt, pb = self.space_pad
        h, w = buf.shape[3], buf.shape[4]
        cols = slice(pl, w - pr)
        if pt:
            buf[:, :, :, :pt, cols] = buf[:, :, :, pt : pt + 1, cols]
        if pb:
            buf[:, :, :, h - pb :, cols] = buf[:, :, :, h - pb - 1 : h - pb, cols]
        if pl:
            buf[:, :, :, :, :pl] = buf[:, :, :, :, pl : pl + 1]
        if pr:
            buf[:, :, :, :, w - pr :] = buf[:, :, :, :, w - pr - 1 : w - pr]

    def _carry(self, stream: Stream | None, last: torch.Tensor) -> None:
        """The stream keeps a copy of the last `history` input frames for the next chunk -- or, past the
        clip's (or tile's) last chunk, drops them now."""
        if self.history and stream is not None:
            if stream.keep:
                stream.frames[id(self)] = last.clone()
            else:
                stream.frames.pop(id(self), None)


def _onednn(x: torch.Tensor) -> bool:
    """Whether this convolution calls oneDNN directly. F.conv3d sends a batch-1 3x3x3 convolution whose
    N*C*T*H is at most 20480 (torch's heuristic: e.g. 16 channels, 3 frames, 272 rows -- one output
    frame of a tile) to its native path, which unfolds the whole input (27 x the input's size: 210 MB
    there) and takes 0.107 s where oneDNN takes 0.009 s (2 cores, torch 2.13). Above that size torch
    calls the same oneDNN convolution, so the bits are the same as before."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.is_contiguous(memory_format=torch.channels_last_3d)
        and torch.backends.mkldnn.is_available()
    )


def _conv_layout(x: torch.Tensor) -> torch.memory_format:
    """The padded input's layout. On the CPU channels-last (NDHWC): oneDNN convolves it in place, where
    an NCDHW input is first reordered into its blocked layout and the output reordered back -- two
    extra copies, 1.6x the output's size at a 16-channel 272x448 tile (97 MB peak for a 37 MB output
    against 37 MB), and 0.11 s against 0.06-0.08 s (2 cores, torch 2.13). The output comes back
    channels-last too, and the norms and activations between convolutions keep that layout. Elsewhere
    the layout torch has always used here."""
    return torch.channels_last_3d if x.device.type == "cpu" else torch.contiguous_format
