"""LTX-2's audio-video transformer (Lightricks' LTX-2 19B, and the LTX-2.3 / 2.5 layouts), run on the component's own
castable ops, in the file's own naming: the release's (`patchify_proj`, `adaln_single`, `av_ca_*_adaln_single`,
`q_norm`, under `model.diffusion_model.` with the text connectors beside the transformer) or diffusers'
(`proj_in`, `time_embed`, `av_cross_attn_*`, `norm_q`, renamed onto them: engine.lora.family_names.LTX).

Architecture facts, from Lightricks/LTX-2 `ltx_core/model/transformer/` (model.py, transformer.py,
transformer_args.py, rope.py, attention.py), `ltx_core/text_encoders/gemma/embeddings_connector.py`, diffusers'
`LTX2VideoTransformer3DModel` / `LTX2AudioVideoRotaryPosEmbed` / `LTX2TextConnectors` and its
`convert_ltx2_to_diffusers.py` configs (written from that description, nothing copied). It is LTX-Video's block
(engine.denoise.ltxv: the per-block scale-shift tables, whole-width RMS QK-norm, adaLN-single) twice over, a video
stream and an audio stream, which meet in two cross-modal attentions:

* video: x [B, 128, F, H, W] latents, one token per latent pixel → `patchify_proj` (4096 wide); audio: [B, T, 128]
  tokens (the audio VAE's [B, 8, T, 16] latent patchified channels outer, mel bins inner) → `audio_patchify_proj`
  (2048 wide). Video self-attention 32 heads of 128, audio 32 of 64, the cross-modal ones the audio stream's.
* Each stream's t in 0–1 (sigma; one per batch item or per token) × 1000 → its adaLN-single (`adaln_single`,
  `audio_adaln_single`: a timestep embedder e and Linear(SiLU(e)) to the 6 block modulations, 9 with LTX-2.3's
  cross-attention AdaLN); e modulates the output layer. Cross-modal modulations: `av_ca_video_scale_shift_adaln_single`
  (4 rows) and `av_ca_a2v_gate_adaln_single` (1), and the audio stream's pair, on the stream's own t (LTX-2.0) or
  on the other stream's sigma (LTX-2.3 / 2.5, diffusers' `use_cross_timestep`); the gates' t × 1000 / 1000 (the
  releases' `av_ca_timestep_scale_multiplier`).
* Text: each stream's context, `caption_projection` (Linear, tanh-GELU, Linear; LTX-2.0 only: from the 3840-wide
  connector states; LTX-2.3 projects per stream before its connectors). A release file holds the text connectors
  under the same prefix (`video_embeddings_connector`, `audio_embeddings_connector`), run here as the step's first
  ops: padding tokens replaced by the learnable registers (the prompt's tokens first in their order, then the
  registers at their positions, diffusers' LTX2ConnectorTransformer1d), 1-D RoPE over the token index / 4096, blocks
  of x += attn(RMS(x)), x += ff(RMS(x)) (30 heads of 128; LTX-2.3's gated, 32 heads), a final RMS. The feature
  extractor before them (`text_embedding_projection`) is outside the transformer's prefix, the text encoder's.
* Block: (shift, scale, gate, shift₂, scale₂, gate₂[, shift_q, scale_q, gate_q]) = `scale_shift_table` + the
  stream's modulations; per stream x += gate · attn1(RMS(x)·(1 + scale) + shift) (RoPE); then x += attn2(q, ctx)
  with q = RMS(x) (LTX-2.3: ·(1 + scale_q) + shift_q, the output × gate_q, and the context modulated by
  `prompt_scale_shift_table` + `prompt_adaln_single`(sigma), or the table alone where the file has no
  prompt_adaln_single); then, from RMS(x_video) and RMS(x_audio) taken once, audio-to-video (q video, k/v audio)
  and video-to-audio attentions, each side modulated by its `scale_shift_table_a2v_ca_*` rows (scale, shift: a2v
  rows 0–1, v2a 2–3) + the cross-modal modulations, gated by row 4 + the gate modulation; then x += gate₂ ·
  ff(RMS(x)·(1 + scale₂) + shift₂) (Linear, tanh-GELU, Linear, 4× wide; LTX-2.5's video one bias-free). RMS:
  affine-free, eps 1e-6; q and k RMS-normalised over the whole width with weights (eps 1e-6); LTX-2.3's
  `to_gate_logits` scale each head's output by 2·sigmoid(gate(x)).
* RoPE (`split`, the releases' `rope_type`): each token at the middle of its span in pixels and seconds: video
  frames [8f + 1 − 8, 8(f + 1) + 1 − 8] clamped at 0, over the frame rate (24 unless given), rows and columns
  [32i, 32(i + 1)]; audio latent frames [4t + 1 − 4, 4(t + 1) + 1 − 4] mel frames clamped at 0, × 160 / 16000 s;
  over the maxima (20, 2048, 2048) / 20; n = width / (2 · axes) frequencies theta^(j / (n − 1)) · π/2 (theta 10000,
  worked out in float64: `frequencies_precision`), angle f_j · (2p − 1), the axes inner per frequency, the missing
  width / 2 − n · axes leading ones unrotated; the angles split over the heads (each head's half-width rotations),
  rotate-half within each head, in float32. The cross-modal attentions rotate their queries and keys by their own
  streams' times alone (over 20), at the audio attention's width.
* LTX-2.5 adds `keyframes_abs_pos_embedding` [1, 4096], added to the video tokens a keyframes mask marks.
* Output: each stream's `proj_out`(LN(x)·(1 + scale) + shift) with (shift, scale) = its root table + e.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .common import NormedAttn as Attn
from .common import held, held_shape, wshape
from .ltxv import (
    TIME_SCALE,
    adaln_single,
    attend,
    gelu_mlp,
    key_mask,
    modulated_out,
    modulation,
    positions,
    rms,
    rope_angles,
)

HEADS = 32  # video and audio attention heads (the releases' num_attention_heads / audio_num_attention_heads)
CONNECTOR_HEADS = 30  # LTX-2.0's text connectors' (connector_num_attention_heads); gated ones: their gates'
EPS = 1e-6  # the blocks' RMS and the attentions' q / k norms
FPS = 24.0  # the LTX-2 pipelines' frame rate
VIDEO_MAX = (20.0, 2048.0, 2048.0)  # positional_embedding_max_pos
AUDIO_MAX = 20.0  # audio_positional_embedding_max_pos
CROSS_MAX = max(VIDEO_MAX[0], AUDIO_MAX)  # the cross-modal RoPE's: the streams' times over the larger maximum
CONNECTOR_MAX = 4096.0  # the connectors' positions' maximum (diffusers' connector_rope_base_seq_len)
AUDIO_SCALE = 4  # mel frames per audio latent frame (the audio VAE's temporal compression)
HOP, SAMPLE_RATE = 160, 16000  # the mel spectrogram's hop and sampling rate
AUDIO_RATE = SAMPLE_RATE / HOP / AUDIO_SCALE  # audio latent frames a second (25)
TABLES = {"release": ("scale_shift_table_a2v_ca_video", "scale_shift_table_a2v_ca_audio"),
          "diffusers": ("video_a2v_cross_attn_scale_shift_table", "audio_a2v_cross_attn_scale_shift_table")}  # fmt: skip


@dataclass
class AdaLN:
    """An adaLN-single: a timestep embedder (Linear, SiLU, Linear) and its Linear to `rows` modulations."""

    embedder: tuple[object, object]
    linear: object

    def __call__(self, t, b: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return adaln_single(self.embedder, self.linear, t, b, dtype)

    def ops(self) -> list:
        return [*self.embedder, self.linear]


@dataclass
class ConnectorBlock:
    attn: Attn
    ff: tuple[object, object]


@dataclass
class Connector:
    """A text connector (`video_embeddings_connector` / `audio_embeddings_connector`): the text states -> one
    stream's context."""

    holder: object  # the plain module holding `learnable_registers` [R, D]
    blocks: list[ConnectorBlock]
    heads: int

    @property
    def registers(self) -> int:
        return held_shape(self.holder, "learnable_registers")[0]

    @property
    def width(self) -> int:
        return wshape(self.blocks[0].attn.q)[1]

    def __call__(self, x: torch.Tensor, mask) -> torch.Tensor:
        b, n, d = x.shape
        reg = held(self.holder, "learnable_registers", x.device).to(x.device, x.dtype)
        if mask is not None and not bool(mask.all()):
            # the prompt's tokens first in their order, the registers (by position) in the padding's place
            keep = mask != 0
            order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
            first = torch.gather(x, 1, order[..., None].expand(-1, -1, d))
            front = torch.arange(n, device=x.device)[None] < keep.sum(1, keepdim=True)
            x = torch.where(front[..., None], first, reg.repeat(n // reg.shape[0], 1)[None])
        idx = torch.arange(n, dtype=torch.float32, device=x.device)[None, :, None] / CONNECTOR_MAX
        pe = split_table(rope_angles(idx, d // 2, double=True), d, self.heads)
        for blk in self.blocks:
            x = x + attend(blk.attn, rms(x), None, self.heads, EPS, rope_split, pe)
            x = x + gelu_mlp(blk.ff, rms(x))
        return rms(x)

    def ops(self) -> list:
        return [op for blk in self.blocks for op in (*blk.attn.ops(), *blk.ff)]


@dataclass
class Stream:
    """One modality's stem and head: video's or audio's."""

    proj_in: object
    time: AdaLN
    prompt: AdaLN | None  # LTX-2.3's prompt_adaln_single (the context's modulation by sigma)
    ca_scale_shift: AdaLN  # the cross-modal attentions' scale / shift modulations (4 rows)
    ca_gate: AdaLN  # and the gate of the attention whose queries are this stream's (1 row)
    caption: tuple[object, object] | None  # LTX-2.0's caption_projection
    connector: Connector | None  # the text connector, where the file holds it
    proj_out: object
    heads: int

    @property
    def width(self) -> int:
        return wshape(self.proj_in)[0]

    @property
    def channels(self) -> int:
        return wshape(self.proj_in)[1]

    def context_dim(self, attn2: Attn) -> int:
        """The width of the stream's text input: its connector's, else its caption projection's, else its text
        attention's (`attn2`)."""
        if self.connector is not None:
            return self.connector.width
        return wshape(self.caption[0] if self.caption is not None else attn2.k)[1]


@dataclass
class Block:
    tables: object  # the plain module holding the block's scale-shift tables
    names: tuple[str, str]  # the names of its cross-modal tables (video's, audio's) in the file's naming
    attn1: Attn
    audio_attn1: Attn
    attn2: Attn
    audio_attn2: Attn
    a2v: Attn  # audio_to_video_attn: queries video, keys and values audio
    v2a: Attn  # video_to_audio_attn
    ff: tuple[object, object]
    audio_ff: tuple[object, object]

    def ops(self) -> list:
        return [*self.attn1.ops(), *self.audio_attn1.ops(), *self.attn2.ops(), *self.audio_attn2.ops(),
                *self.a2v.ops(), *self.v2a.ops(), *self.ff, *self.audio_ff]  # fmt: skip


@dataclass
class LTX2:
    """A bound LTX-2 transformer: call it with video_latent, video_timesteps, video_context, audio_latent,
    audio_timesteps, audio_context [, their masks, sigmas, fps, video_keyframes_mask]; it returns the video
    stream's output ([B, 128, F, H, W]); `outputs` gives the audio stream's too."""

    architecture: str
    video: Stream
    audio: Stream
    blocks: list[Block]
    root: object  # the root module holding the output tables (and LTX-2.5's keyframe embedding)
    keyframes: bool
    cross_sigma: bool  # the cross-modal modulations on the other stream's sigma (LTX-2.3 / 2.5)
    dtype: torch.dtype = torch.float32
    family = "ltx2"

    @property
    def in_channels(self) -> int:
        return self.video.channels

    @property
    def audio_channels(self) -> int:
        return self.audio.channels

    @property
    def context_dim(self) -> int:
        return self.video.context_dim(self.blocks[0].attn2)

    @property
    def audio_context_dim(self) -> int:
        return self.audio.context_dim(self.blocks[0].audio_attn2)

    @property
    def registers(self) -> int | None:
        """The text connectors' register count (a text's token count must be a multiple of it); None without."""
        c = self.video.connector or self.audio.connector
        return c.registers if c is not None else None

    def __call__(self, **inputs) -> torch.Tensor:
        return self.outputs(**inputs)["out"]

    def outputs(self, video_latent, video_timesteps, video_context, audio_latent, audio_timesteps, audio_context,
                video_context_mask=None, audio_context_mask=None, video_sigma=None, audio_sigma=None, fps=None,
                video_keyframes_mask=None) -> dict:  # fmt: skip
        """{"out": the video stream's output [B, C, F, H, W], "audio_out": the audio stream's [B, T, C]}."""
        dt, v, a = self.dtype, self.video, self.audio
        b, _, f, h, w = video_latent.shape
        dev = video_latent.device
        vctx, vkeys = _text(v, video_context.to(dt), video_context_mask)
        actx, akeys = _text(a, audio_context.to(dt), audio_context_mask)
        vx = v.proj_in(video_latent.to(dt).flatten(2).transpose(1, 2))  # [B, F·H·W, D]
        if video_keyframes_mask is not None and self.keyframes:
            emb = held(self.root, "keyframes_abs_pos_embedding", dev).to(dev, dt)
            vx = vx + (video_keyframes_mask > 0).to(dt)[..., None] * emb
        ax = a.proj_in(audio_latent.to(dt))  # [B, T, Da]
        vt, at = video_timesteps.float() * TIME_SCALE, audio_timesteps.float() * TIME_SCALE
        vmods, ve = v.time(vt, b, dt)
        amods, ae = a.time(at, b, dt)
        vsig = _sigma(video_sigma, video_timesteps) * TIME_SCALE
        asig = _sigma(audio_sigma, audio_timesteps) * TIME_SCALE
        vprompt = v.prompt(vsig, b, dt)[0] if v.prompt is not None else None
        aprompt = a.prompt(asig, b, dt)[0] if a.prompt is not None else None
        vca_t, aca_t = (asig, vsig) if self.cross_sigma else (vt, at)
        vca, vgate = v.ca_scale_shift(vca_t, b, dt)[0], v.ca_gate(vca_t, b, dt)[0]
        aca, agate = a.ca_scale_shift(aca_t, b, dt)[0], a.ca_gate(aca_t, b, dt)[0]
        if v.caption is not None:
            vctx = gelu_mlp(v.caption, vctx)
        if a.caption is not None:
            actx = gelu_mlp(a.caption, actx)
        rate = fps.float().to(dev) if fps is not None else torch.full((b,), FPS, device=dev)
        vpos = (positions(f, h, w, rate) + positions(f, h, w, rate, shift=1)) / 2  # the tokens' middles
        vfrac = vpos / torch.tensor(VIDEO_MAX, dtype=torch.float32, device=dev)
        apos = audio_positions(ax.shape[1], dev).expand(b, -1, -1)
        cross = wshape(self.blocks[0].a2v.q)[0]  # the cross-modal attentions' width (the audio stream's)
        pe = {
            "video": split_table(rope_angles(vfrac, v.width // 6, double=True), v.width, v.heads),
            "audio": split_table(rope_angles(apos / AUDIO_MAX, a.width // 2, double=True), a.width, a.heads),
            "video_cross": split_table(
                rope_angles(vpos[..., :1] / CROSS_MAX, cross // 2, double=True), cross, v.heads
            ),
            "audio_cross": split_table(
                rope_angles(apos / CROSS_MAX, cross // 2, double=True), cross, a.heads
            ),
        }
        for blk in self.blocks:
            vx, ax = self._block(blk, vx, ax, vctx, actx, vkeys, akeys, (vmods, amods), (vprompt, aprompt),
                                 (vca, aca, vgate, agate), pe)  # fmt: skip
        vout = modulated_out(self.root, "scale_shift_table", ve, vx, v.proj_out)
        aout = modulated_out(self.root, "audio_scale_shift_table", ae, ax, a.proj_out)
        return {"out": vout.transpose(1, 2).reshape(b, -1, f, h, w), "audio_out": aout}

    def _block(self, blk: Block, vx, ax, vctx, actx, vkeys, akeys, mods, prompt, cross, pe):
        vh, ah = self.video.heads, self.audio.heads
        vp = modulation(blk.tables, "scale_shift_table", mods[0])
        ap = modulation(blk.tables, "audio_scale_shift_table", mods[1])
        # self-attentions
        vx = (
            vx
            + attend(blk.attn1, rms(vx) * (1 + vp[1]) + vp[0], None, vh, EPS, rope_split, pe["video"]) * vp[2]
        )
        ax = (
            ax
            + attend(blk.audio_attn1, rms(ax) * (1 + ap[1]) + ap[0], None, ah, EPS, rope_split, pe["audio"])
            * ap[2]
        )
        # text cross-attentions
        vx = vx + self._text_attn(
            blk, blk.attn2, vx, vctx, vkeys, vp, prompt[0], "prompt_scale_shift_table", vh
        )
        ax = ax + self._text_attn(blk, blk.audio_attn2, ax, actx, akeys, ap, prompt[1],
                                  "audio_prompt_scale_shift_table", ah)  # fmt: skip
        # audio-to-video and video-to-audio, both from the streams as they are now
        vca, aca, vgate, agate = cross
        nv, na = rms(vx), rms(ax)
        v_a2v_scale, v_a2v_shift, v_v2a_scale, v_v2a_shift = _rows(blk.tables, blk.names[0], vca, 0, 4)
        a_a2v_scale, a_a2v_shift, a_v2a_scale, a_v2a_shift = _rows(blk.tables, blk.names[1], aca, 0, 4)
        (a2v_gate,) = _rows(blk.tables, blk.names[0], vgate, 4, 5)
        (v2a_gate,) = _rows(blk.tables, blk.names[1], agate, 4, 5)
        q, kv = nv * (1 + v_a2v_scale) + v_a2v_shift, na * (1 + a_a2v_scale) + a_a2v_shift
        vx = vx + a2v_gate * attend(blk.a2v, q, kv, ah, EPS, rope_split, pe["video_cross"], pe["audio_cross"])
        q, kv = na * (1 + a_v2a_scale) + a_v2a_shift, nv * (1 + v_v2a_scale) + v_v2a_shift
        ax = ax + v2a_gate * attend(blk.v2a, q, kv, ah, EPS, rope_split, pe["audio_cross"], pe["video_cross"])
        # feed-forwards
        vx = vx + gelu_mlp(blk.ff, rms(vx) * (1 + vp[4]) + vp[3]) * vp[5]
        ax = ax + gelu_mlp(blk.audio_ff, rms(ax) * (1 + ap[4]) + ap[3]) * ap[5]
        return vx, ax

    @staticmethod
    def _text_attn(blk: Block, attn: Attn, x, ctx, keys, p, prompt, table: str, heads: int):
        """x's attention to its text: RMS(x) as the queries; LTX-2.3's AdaLN on the queries (rows 6–8), the
        context (the prompt table + prompt_adaln_single's modulation) and the output (gate_q)."""
        q = rms(x)
        if len(p) == 9:
            q = q * (1 + p[7]) + p[6]
        if getattr(blk.tables, table, None) is not None:
            t = held(blk.tables, table, x.device).to(x.device, x.dtype)
            shift, scale = (t[None, None] + prompt.reshape(*prompt.shape[:2], 2, -1) if prompt is not None
                            else t[None, None]).unbind(2)  # fmt: skip
            ctx = ctx * (1 + scale) + shift
        out = attend(attn, q, ctx, heads, EPS, keys=keys)
        return out * p[8] if len(p) == 9 else out

    def op_order(self) -> list:
        v, a = self.video, self.audio
        order = [*(v.connector.ops() if v.connector else ()), *(a.connector.ops() if a.connector else ()),
                 v.proj_in, a.proj_in, *v.time.ops(), *a.time.ops(), *(v.prompt.ops() if v.prompt else ()),
                 *(a.prompt.ops() if a.prompt else ()), *v.ca_scale_shift.ops(), *v.ca_gate.ops(),
                 *a.ca_scale_shift.ops(), *a.ca_gate.ops(), *(v.caption or ()), *(a.caption or ())]  # fmt: skip
        for blk in self.blocks:
            order += blk.ops()
        return [*order, v.proj_out, a.proj_out]


def _text(stream: Stream, ctx: torch.Tensor, mask):
    """(the stream's context, its key mask): through its text connector where the file holds one (which puts its
    registers in the padding's place: every token is attended then), else as given."""
    if stream.connector is not None:
        return stream.connector(ctx, mask), None
    return ctx, key_mask(mask)


def _sigma(sigma, timesteps: torch.Tensor) -> torch.Tensor:
    """A stream's sigma [B]: given, else its timesteps' (one per batch item), or their largest (one per token:
    conditioning tokens are at 0, the others at the step's sigma)."""
    if sigma is not None:
        return sigma.float().reshape(-1)
    t = timesteps.float()
    return t.reshape(t.shape[0], -1).amax(dim=1)


def _rows(holder, attr: str, mods: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, ...]:
    """Rows lo..hi-1 of a block's cross-modal table `holder.attr` [5, D] plus their modulations [B, 1 or S,
    (hi − lo)·D]."""
    table = held(holder, attr, mods.device).to(mods.device, mods.dtype)[lo:hi]
    return (table[None, None] + mods.reshape(*mods.shape[:2], hi - lo, -1)).unbind(2)


def audio_positions(t: int, device) -> torch.Tensor:
    """[1, T, 1] the audio latent frames' middles in seconds (the causal first frame: mel frames 4t + 1 − 4
    clamped at 0, a mel frame 160 / 16000 s)."""
    g = torch.arange(t, dtype=torch.float32, device=device)

    def seconds(shift: int) -> torch.Tensor:
        return ((g + shift) * AUDIO_SCALE + 1 - AUDIO_SCALE).clamp(min=0) * HOP / SAMPLE_RATE

    return ((seconds(0) + seconds(1)) / 2)[None, :, None]


def split_table(ang: torch.Tensor, dim: int, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, S, n] angles -> (cos, sin) [B, S, heads, dim / (2·heads)]: the leading dim / 2 − n padded unrotated,
    then split over the heads (LTX-2's `split` RoPE), in float32."""
    pad = dim // 2 - ang.shape[-1]
    cos, sin = ang.cos(), ang.sin()
    if pad:
        cos = torch.cat([torch.ones_like(cos[..., :pad]), cos], dim=-1)
        sin = torch.cat([torch.zeros_like(sin[..., :pad]), sin], dim=-1)
    return cos.reshape(*cos.shape[:2], heads, -1), sin.reshape(*sin.shape[:2], heads, -1)


def rope_split(x: torch.Tensor, pe: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Split RoPE on [B, S, heads·d]: each head's first half rotated with its second (rotate-half), each head by
    its own rotations `pe` (split_table), in float32."""
    cos, sin = pe
    b, s, w = x.shape
    xf = x.float().reshape(b, s, cos.shape[2], 2, -1)
    x1, x2 = xf[..., 0, :], xf[..., 1, :]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-2).reshape(b, s, w)
