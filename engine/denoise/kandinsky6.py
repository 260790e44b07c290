"""Kandinsky 6's transformer forward pass (kandinskylab, 2026: text / image to video with audio), run on the
component's own castable ops, in diffusers' names (`Kandinsky6Transformer3DModel`, the names its files ship).

Architecture facts, from diffusers' `transformer_kandinsky6.py` and `pipelines/kandinsky6/pipeline_kandinsky6_ti2va.py`
(read for the facts, written from that description, nothing copied). It is Kandinsky 5 (engine.denoise.kandinsky5)
twice — a video branch and an audio branch — with attention between the two:

* Each branch has its own text stack on the same prompt: `{video,audio}_text_embeddings` (in_layer, LayerNorm with
  affine, eps 1e-5) of Qwen2.5-VL's states, `{video,audio}_text_transformer_blocks.N` (Kandinsky 5's text block: a
  6-fold `text_modulation`, self-attention `attn` with 1-D RoPE, GELU MLP `feed_forward.net.0.proj` / `net.2`), and its
  own conditioning c = `{video,audio}_time_embeddings.timestep_embedder` (linear_1, SiLU, linear_2) of the sinusoidal t
  (cosines first, 10000^(-i/half)) + `{video,audio}_pooled_text_embeddings` (in_layer, LayerNorm) of CLIP's pooled 768.
* Video tokens: Kandinsky 5's (1, 2, 2) patches of the channels-last latent → `visual_embeddings.in_layer` ([noise 16
  | condition 16 | mask 1] for a `visual_cond` model), plus, where the file holds `visual_token_type_embeddings`, each
  frame's type (the image-conditioned pipeline appends the reference as a last frame of type 1). 3-D RoPE over axes
  (head/4, 3·head/8, 3·head/8), the angles divided by the config's scale_factor (1, 2, 2 by default: an input here).
  Audio tokens: `audio_embeddings` (in_layer, LayerNorm) of the audio latent [B, La, 20], 1-D RoPE.
* `visual_transformer_blocks.N` each hold a `video_dec_block` and an `audio_dec_block` (Kandinsky 5's visual block:
  9-fold `visual_modulation`, self-attention with RoPE, cross-attention to its branch's text, MLP) and, between the
  cross-attention and the MLP, `va_cross_attention` (video queries, audio keys: the audio's pre-cross-attention
  normed input) and `av_cross_attention` (the other way round), each on an affine-free LayerNorm modulated by
  `va_modulation` / `av_modulation`. The released configs set `cross_gates` (each modulation holds shift and scale
  for its own side and the gate of the other side's sum), `ca_rope` (each side's RoPE on the queries and keys of these
  attentions) and `fix_modulation` (each modulation reads its own branch's c): what this forward computes.
* Attention as Kandinsky 5's (per-head RMS q / k norms in float32, interleaved-pair RoPE in float32), without its
  bfloat16 rounding of the rotated q and k; an optional boolean text mask [B, L] on every attention to the prompt.
* Out: video as Kandinsky 5's head (`out_layer`); audio `audio_out_layer`: the modulated affine-free LayerNorm, then the
  norm once more (the release's head), then `out_layer` → [B, La, 20].

Without `audio_hidden_states` the video branch runs alone (no audio attention), as diffusers' forward does.

Inputs (diffusers' forward's names): `hidden_states` [B, T, H, W, C] (channels last), `encoder_hidden_states`
[B, L, 3584], `timestep` [B] (0–1000), `pooled_projections` [B, 768]; optionally `audio_hidden_states` [B, La, 20],
`encoder_attention_mask` [B, L] (true: a prompt token), `visual_token_type_ids` [B, T] (a file with type
embeddings), `frame_positions` [T] (the temporal RoPE index of each latent frame; aranges by default, the
image-conditioned pipeline's last frame 0) and `scale_factor` [B, 3] (default 1, 2, 2). Outputs: `out` (the video's
velocity, [B, T, H, W, 16]) and, with audio, `audio_out`. A self-described family (engine.denoise.SELF_DESCRIBED).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import Ops, layer_norm_with, merge_heads, mlp2, rope, split_heads, timestep_embedding, wshape
from .kandinsky5 import AXES, LN_EPS, PATCH, Attention, check_patches, qk_norm, rope_freqs, rotations

SCALE = (1.0, 2.0, 2.0)  # diffusers' config default for the video RoPE's divisors
TOKENS = 256  # a random step's prompt tokens
AUDIO_PER_FRAME = 4  # a random step's audio tokens per latent frame (the pipeline: ~25 latents a second)
_ATTN = ("to_query", "to_key", "to_value", "query_norm", "key_norm", "out_layer")


@dataclass
class Branch:
    """One modality's own layers: its text stack, conditioning and decoder blocks' halves."""

    text_in: tuple[object, object]  # in_layer, norm
    time: tuple[object, object]  # linear_1, linear_2
    pooled_in: tuple[object, object]
    text_blocks: list[tuple]  # (modulation, Attention, ff_in, ff_out)

    def ops(self) -> list:
        out = [*self.text_in, *self.pooled_in, *self.time]
        for mod, a, ff_in, ff_out in self.text_blocks:
            out += [mod, *a.ops(), ff_in, ff_out]
        return out


@dataclass
class Half:
    """A decoder block's half for one modality (Kandinsky 5's visual block)."""

    modulation: object
    attn: Attention
    cross: Attention
    ff_in: object
    ff_out: object


@dataclass
class Fused:
    video: Half
    audio: Half
    va: Attention  # video queries, audio keys
    av: Attention
    va_mod: object
    av_mod: object


@dataclass
class Kandinsky6:
    """A bound Kandinsky 6 transformer (see the module's docstring for its inputs)."""

    architecture: str
    visual_in: object
    token_types: object | None
    audio_in: tuple[object, object]
    video: Branch
    audio: Branch
    blocks: list[Fused]
    out: tuple[object, object]  # modulation, out_layer
    audio_out: tuple[object, object]
    head: int
    head_a: int
    dtype: torch.dtype = torch.float32
    family = "kandinsky6"
    step_inputs = ("hidden_states", "encoder_hidden_states", "timestep", "pooled_projections")
    step_optional = ("audio_hidden_states", "encoder_attention_mask", "visual_token_type_ids", "frame_positions",
                     "scale_factor")  # fmt: skip
    unbatched = ("frame_positions",)  # one frame grid for the whole batch, as diffusers' visual_rope_pos

    @property
    def hidden(self) -> int:
        return wshape(self.visual_in)[0]

    @property
    def in_channels(self) -> int:
        return wshape(self.visual_in)[1] // (PATCH[0] * PATCH[1] * PATCH[2])

    @property
    def out_channels(self) -> int:
        return wshape(self.out[1])[0] // (PATCH[0] * PATCH[1] * PATCH[2])

    @property
    def audio_channels(self) -> int:
        return wshape(self.audio_in[0])[1]

    @property
    def text_dim(self) -> int:
        return wshape(self.video.text_in[0])[1]

    @property
    def pooled_dim(self) -> int:
        return wshape(self.video.pooled_in[0])[1]

    def __call__(self, **inputs) -> torch.Tensor:
        return self.outputs(**inputs)["out"]

    def outputs(self, hidden_states, encoder_hidden_states, timestep, pooled_projections, audio_hidden_states=None,
                encoder_attention_mask=None, visual_token_type_ids=None, frame_positions=None,
                scale_factor=None) -> dict:  # fmt: skip
        dt, dev = self.dtype, hidden_states.device
        b, t, h, w, c = hidden_states.shape
        pt, ph, pw = PATCH
        tp, hp, wp = t // pt, h // ph, w // pw
        mask = (
            None if encoder_attention_mask is None else encoder_attention_mask.to(dev).bool()[:, None, None]
        )
        txt_v, c_v = self._text(
            self.video, encoder_hidden_states, timestep, pooled_projections, mask, self.head
        )
        aud = None
        if (
            audio_hidden_states is not None
        ):  # diffusers runs the audio text stack always; unused without audio
            txt_a, c_a = self._text(
                self.audio, encoder_hidden_states, timestep, pooled_projections, mask, self.head_a
            )
        x = hidden_states.to(dt).reshape(b, tp, pt, hp, ph, wp, pw, c).permute(0, 1, 3, 5, 2, 4, 6, 7)
        x = self.visual_in(x.reshape(b, tp, hp, wp, -1))
        if self.token_types is not None and visual_token_type_ids is not None:
            x = x + self.token_types(visual_token_type_ids.to(dev).long())[:, :, None, None]
        x = x.reshape(b, tp * hp * wp, -1)
        scales = torch.tensor([SCALE]).expand(b, 3) if scale_factor is None else scale_factor.float().cpu()
        frames = torch.arange(tp) if frame_positions is None else frame_positions.cpu().long()
        pe_v = rope_video(frames, (hp, wp), AXES[self.head], scales, dev)
        if audio_hidden_states is not None:
            aud = layer_norm_with(self.audio_in[1], self.audio_in[0](audio_hidden_states.to(dt)), LN_EPS)
            pe_a = _rope_1d(torch.arange(aud.shape[1]), self.head_a, dev)
        for blk in self.blocks:
            if aud is None:
                x = self._video_alone(blk.video, x, c_v, pe_v, txt_v, mask)
            else:
                x, aud = self._fused(blk, x, aud, (c_v, c_a), (pe_v, pe_a), (txt_v, txt_a), mask)
        mod, lin = self.out
        shift, scale = mod(F.silu(c_v)).float().chunk(2, dim=-1)
        x = modulate(x, shift[:, None], scale[:, None])
        y = lin(x).reshape(b, tp, hp, wp, -1, pt, ph, pw)  # each token's values: (channel, t, h, w)
        outs = {"out": y.permute(0, 1, 5, 2, 6, 3, 7, 4).reshape(b, tp * pt, hp * ph, wp * pw, -1)}
        if aud is not None:
            mod, lin = self.audio_out
            shift, scale = mod(F.silu(c_a)).float().chunk(2, dim=-1)
            a = modulate(aud, shift[:, None], scale[:, None])
            outs["audio_out"] = lin(_renorm(a))
        return outs

    def _text(self, br: Branch, states, timestep, pooled, mask, head: int):
        """A branch's prompt tokens through its text blocks, and its conditioning c."""
        dt = self.dtype
        txt = layer_norm_with(br.text_in[1], br.text_in[0](states.to(dt)), LN_EPS)
        pooled = layer_norm_with(br.pooled_in[1], br.pooled_in[0](pooled.to(dt)), LN_EPS)
        temb = timestep_embedding(timestep.float().to(txt.device), wshape(br.time[0])[1])
        cemb = mlp2(br.time, temb.to(dt)) + pooled
        pe = _rope_1d(torch.arange(txt.shape[1]), head, txt.device)
        for mod, a, ff_in, ff_out in br.text_blocks:
            m = modulations(mod, cemb, 6)
            txt = gated(txt, m[2], self._attn(a, modulate(txt, m[0], m[1]), None, pe, pe, mask))
            txt = gated(txt, m[5], ff_out(F.gelu(ff_in(modulate(txt, m[3], m[4])), approximate="none")))
        return txt, cemb

    def _video_alone(self, half: Half, x, cemb, pe, txt, mask):
        m = modulations(half.modulation, cemb, 9)
        x = gated(x, m[2], self._attn(half.attn, modulate(x, m[0], m[1]), None, pe, pe, None))
        x = gated(x, m[5], self._attn(half.cross, modulate(x, m[3], m[4]), txt, None, None, mask))
        return gated(x, m[8], half.ff_out(F.gelu(half.ff_in(modulate(x, m[6], m[7])))))

    def _fused(self, blk: Fused, x, aud, cembs, pes, txts, mask):
        """Both halves' self-attention and cross-attention to their text, the attention between the two (on each
        side's pre-cross-attention input, with both RoPEs), then both MLPs."""
        (c_v, c_a), (pe_v, pe_a), (txt_v, txt_a) = cembs, pes, txts
        mv, ma = modulations(blk.video.modulation, c_v, 9), modulations(blk.audio.modulation, c_a, 9)
        x = gated(x, mv[2], self._attn(blk.video.attn, modulate(x, mv[0], mv[1]), None, pe_v, pe_v, None))
        pre_v = modulate(x, mv[3], mv[4])
        from_txt_v = self._attn(blk.video.cross, pre_v, txt_v, None, None, mask)
        aud = gated(
            aud, ma[2], self._attn(blk.audio.attn, modulate(aud, ma[0], ma[1]), None, pe_a, pe_a, None)
        )
        pre_a = modulate(aud, ma[3], ma[4])
        aud = gated(aud, ma[5], self._attn(blk.audio.cross, pre_a, txt_a, None, None, mask))
        va, av = _cross_mods(blk, c_v, c_a, self.hidden, wshape(self.audio_in[0])[0])
        x = gated(x, mv[5], from_txt_v)
        q_v, q_a = modulate(x, va[0], va[1]), modulate(aud, av[0], av[1])
        from_aud = self._attn(blk.va, q_v, pre_a, pe_v, pe_a, None)
        from_vid = self._attn(blk.av, q_a, pre_v, pe_a, pe_v, None)
        x, aud = gated(x, av[2], from_aud), gated(aud, va[2], from_vid)
        x = gated(x, mv[8], blk.video.ff_out(F.gelu(blk.video.ff_in(modulate(x, mv[6], mv[7])))))
        return x, gated(aud, ma[8], blk.audio.ff_out(F.gelu(blk.audio.ff_in(modulate(aud, ma[6], ma[7])))))

    def _attn(self, a: Attention, x, ctx, pe_q, pe_k, mask):
        """q from x, k / v from ctx (x itself when None); RoPE on q and k where given; `mask` on the keys."""
        ctx = x if ctx is None else ctx
        heads = wshape(a.q)[0] // wshape(a.q_norm)[0]
        q, k, v = (split_heads(p(s), heads) for p, s in ((a.q, x), (a.k, ctx), (a.v, ctx)))
        q, k = qk_norm(a.q_norm, q), qk_norm(a.k_norm, k)
        if pe_q is not None:
            q, k = rope(q, pe_q), rope(k, pe_k)
        return a.o(merge_heads(F.scaled_dot_product_attention(q, k, v.to(q.dtype), attn_mask=mask)))

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """One latent frame at width × height pixels (8x latent), noise in the first 16 channels (the condition and
        mask zeros, as the text-to-video pipeline passes them), TOKENS prompt tokens, AUDIO_PER_FRAME audio tokens."""
        from .random_inputs import _latent

        h, w = (n * 2 for n in _latent(width, height, 16))
        x = torch.zeros(batch, 1, h, w, self.in_channels)
        x[..., : self.out_channels] = torch.randn(batch, 1, h, w, self.out_channels, generator=g)
        return {
            "hidden_states": x,
            "encoder_hidden_states": torch.randn(batch, TOKENS, self.text_dim, generator=g),
            "timestep": torch.rand(batch, generator=g) * 1000.0,
            "pooled_projections": torch.randn(batch, self.pooled_dim, generator=g),
            "audio_hidden_states": torch.randn(batch, AUDIO_PER_FRAME, self.audio_channels, generator=g),
        }

    def step_units(self, inputs: dict) -> int:
        """Video and audio tokens, the batch's (what the activations grow with; engine.stepping)."""
        b, t, h, w, _ = inputs["hidden_states"].shape
        audio = inputs.get("audio_hidden_states")
        return b * (
            (t // PATCH[0]) * (h // PATCH[1]) * (w // PATCH[2]) + (0 if audio is None else audio.shape[1])
        )

    def step_shapes(self, got: dict) -> dict:
        """The shape of each input (None: any size on that axis)."""
        out = {"hidden_states": (None, None, None, None, self.in_channels), "encoder_hidden_states": (None, None,
               self.text_dim), "timestep": (None,), "pooled_projections": (None, self.pooled_dim)}  # fmt: skip
        extra = {"audio_hidden_states": (None, None, self.audio_channels), "encoder_attention_mask": (None, None),
                 "visual_token_type_ids": (None, None), "frame_positions": (None,), "scale_factor": (None, 3)}  # fmt: skip
        return {**out, **{k: s for k, s in extra.items() if k in got}}

    def check_extra(self, got: dict, source: str) -> None:
        """Whole patches; a mask as long as the prompt; token types only for a file with their embeddings; one
        position per frame; positive RoPE divisors."""
        x = got["hidden_states"]
        t, h, w = x.shape[1:4]
        if t % PATCH[0] or h % PATCH[1] or w % PATCH[2]:
            raise FormatError(
                f"{source}: input hidden_states is {t}×{h}×{w} (frames × height × width); the model reads "
                f"{'×'.join(map(str, PATCH))} patches"
            )
        m = got.get("encoder_attention_mask")
        if m is not None and m.shape[1] != got["encoder_hidden_states"].shape[1]:
            raise FormatError(
                f"{source}: encoder_attention_mask covers {m.shape[1]} tokens, the prompt holds "
                f"{got['encoder_hidden_states'].shape[1]}"
            )
        types = got.get("visual_token_type_ids")
        if types is not None:
            n = 0 if self.token_types is None else wshape(self.token_types)[0]
            if n == 0:
                raise FormatError(
                    f"{source}: visual_token_type_ids given, but this file holds no token types"
                )
            if types.shape[1] != t // PATCH[0] or bool((types < 0).any() or (types >= n).any()):
                raise FormatError(
                    f"{source}: visual_token_type_ids must give each of the {t // PATCH[0]} frames a type "
                    f"0–{n - 1}"
                )
        f = got.get("frame_positions")
        if f is not None and (f.shape[0] != t // PATCH[0] or bool((f < 0).any())):
            raise FormatError(
                f"{source}: frame_positions must give each of the {t // PATCH[0]} frames a position ≥ 0"
            )
        s = got.get("scale_factor")
        if s is not None and bool((s <= 0).any()):
            raise FormatError(
                f"{source}: input scale_factor holds {s.tolist()}: RoPE's divisors must be positive"
            )

    def op_order(self) -> list:
        """The order of a step with audio (a step without it skips the audio ops). The token types, which only an
        image-conditioned step reads, are not in it: the streamer reads that small table on demand."""
        order = [*self.video.ops(), *self.audio.ops(), self.visual_in, *self.audio_in]
        for blk in self.blocks:
            v, a = blk.video, blk.audio
            order += [
                v.modulation,
                a.modulation,
                *v.attn.ops(),
                *v.cross.ops(),
                *a.attn.ops(),
                *a.cross.ops(),
            ]
            order += [
                blk.va_mod,
                blk.av_mod,
                *blk.va.ops(),
                *blk.av.ops(),
                v.ff_in,
                v.ff_out,
                a.ff_in,
                a.ff_out,
            ]
        return [*order, *self.out, *self.audio_out]


def _cross_mods(blk: Fused, c_v, c_a, dv: int, da: int) -> tuple:
    """(shift, scale, the other side's gate) for the video-audio attention's queries, then the audio-video's: each
    modulation reads its own branch's c (the released `fix_modulation`)."""
    va = blk.va_mod(F.silu(c_v)).float()[:, None].split([dv, dv, da], dim=-1)
    return va, blk.av_mod(F.silu(c_a)).float()[:, None].split([da, da, dv], dim=-1)


def _renorm(a: torch.Tensor) -> torch.Tensor:
    """The audio head's second affine-free LayerNorm, after its modulation (the release's head; diffusers keeps it)."""
    return F.layer_norm(a, (a.shape[-1],), eps=LN_EPS)


def modulations(mod, cemb, n: int) -> tuple:
    return mod(F.silu(cemb)).float()[:, None].chunk(n, dim=-1)


def modulate(x: torch.Tensor, shift, scale) -> torch.Tensor:
    """(1 + scale)·LN(x) + shift in float32 (an affine-free LayerNorm), cast back to x's dtype."""
    return (F.layer_norm(x.float(), (x.shape[-1],), eps=LN_EPS) * (1 + scale) + shift).to(x.dtype)


def gated(x: torch.Tensor, gate, y: torch.Tensor) -> torch.Tensor:
    return (x.float() + gate * y.float()).to(x.dtype)


def _rope_1d(pos: torch.Tensor, head: int, device) -> torch.Tensor:
    """[1, 1, n, head/2, 2, 2]: each position's rotations over the whole head."""
    return rotations(torch.outer(pos.float(), rope_freqs(head)))[None, None].to(device)


def rope_video(
    frames: torch.Tensor, grid: tuple[int, int], axes, scales: torch.Tensor, device
) -> torch.Tensor:
    """[B, 1, t·h·w, head/2, 2, 2]: each patch's rotations, (frame position, row, column) over the three axes, each
    axis' angles divided by the item's scale_factor for it."""
    b, sizes = scales.shape[0], (len(frames), *grid)
    parts = []
    for i, (pos, d) in enumerate(
        zip((frames, torch.arange(grid[0]), torch.arange(grid[1])), axes, strict=True)
    ):
        a = torch.outer(pos.float(), rope_freqs(d))[None] / scales[:, i, None, None]
        shape = [b, 1, 1, 1, d // 2]
        shape[1 + i] = sizes[i]
        parts.append(a.reshape(shape).expand(b, *sizes, d // 2))
    return rotations(torch.cat(parts, dim=-1).reshape(b, 1, -1, sum(axes) // 2)).to(device)


# -- binding the file's ops -----------------------------------------------------------------------------


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, Kandinsky6]:
    """The forward of a Kandinsky 6 transformer (diffusers' names, bare or under a prefix)."""

    def attn(path: str) -> Attention:
        return Attention(*(ops[f"{path}.{n}"] for n in _ATTN))

    def ff(path: str) -> tuple:
        return ops[f"{path}.feed_forward.net.0.proj"], ops[f"{path}.feed_forward.net.2"]

    def branch(m: str) -> Branch:
        blocks = [(ops[f"{m}_text_transformer_blocks.{i}.text_modulation.out_layer"],
                   attn(f"{m}_text_transformer_blocks.{i}.attn"), *ff(f"{m}_text_transformer_blocks.{i}"))
                  for i in ops.children(f"{m}_text_transformer_blocks")]  # fmt: skip
        return Branch(
            (ops[f"{m}_text_embeddings.in_layer"], ops[f"{m}_text_embeddings.norm"]),
            (ops[f"{m}_time_embeddings.timestep_embedder.linear_1"], ops[f"{m}_time_embeddings.timestep_embedder.linear_2"]),
            (ops[f"{m}_pooled_text_embeddings.in_layer"], ops[f"{m}_pooled_text_embeddings.norm"]), blocks,
        )  # fmt: skip

    def half(path: str) -> Half:
        return Half(ops[f"{path}.visual_modulation.out_layer"], attn(f"{path}.self_attention"),
                    attn(f"{path}.cross_attention"), *ff(path))  # fmt: skip

    video, audio = branch("video"), branch("audio")
    blocks = []
    for i in ops.children("visual_transformer_blocks"):
        p = f"visual_transformer_blocks.{i}"
        blocks.append(Fused(half(f"{p}.video_dec_block"), half(f"{p}.audio_dec_block"), attn(f"{p}.va_cross_attention"),
                            attn(f"{p}.av_cross_attention"), ops[f"{p}.va_modulation.out_layer"],
                            ops[f"{p}.av_modulation.out_layer"]))  # fmt: skip
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no Kandinsky 6 visual blocks")
    head, head_a = wshape(blocks[0].video.attn.q_norm)[0], wshape(blocks[0].audio.attn.q_norm)[0]
    hidden, hidden_a = (
        wshape(ops["visual_embeddings.in_layer"])[0],
        wshape(ops["audio_embeddings.in_layer"])[0],
    )
    if head not in AXES or hidden % head or hidden_a % head_a or head_a != head:
        raise UnsupportedModel(
            f"{ops.what}: head widths {head} (video, hidden {hidden}) and {head_a} (audio, hidden {hidden_a}) — "
            f"Kandinsky 6's heads are one width for both, {' or '.join(map(str, AXES))} (their RoPE axes "
            f"{' / '.join(map(str, AXES.values()))}): the attention between them rotates each by the other's RoPE"
        )
    gates = wshape(blocks[0].va_mod)[0]
    if gates != 2 * hidden + hidden_a:
        raise UnsupportedModel(
            f"{ops.what}: a video-audio modulation of {gates} rows, not the released cross-gated "
            f"{2 * hidden + hidden_a} (2 × video {hidden} + audio {hidden_a}): a Kandinsky 6 variant Loadout does not run"
        )
    check_patches(ops, "Kandinsky 6")
    return "diffusers", Kandinsky6(
        architecture, ops["visual_embeddings.in_layer"], ops.get("visual_token_type_embeddings"),
        (ops["audio_embeddings.in_layer"], ops["audio_embeddings.norm"]), video, audio, blocks,
        (ops["out_layer.modulation.out_layer"], ops["out_layer.out_layer"]),
        (ops["audio_out_layer.modulation.out_layer"], ops["audio_out_layer.out_layer"]), head, head_a, dtype,
    )  # fmt: skip
