"""MiniMax-H3's transformer (MiniMax, 2026: one block stack over a packed sequence of text, audio and video rows), run on
the component's own castable ops, in the file's own naming: the release's (`video_patch_proj`, `condition_proj`,
`token_refiner.blocks.N`, `blocks.N.attn.qkv_proj` / `mlp.fc1` / `adaln_proj.linear`, `final_layer.*`: MiniMaxAI's and
Comfy-Org's single files, with or without `model.diffusion_model.`) or diffusers' (`proj_in`, `context_embedder`,
`transformer_blocks.N.attn.to_q` / `ff.net.0.proj`, `norm_out`, `proj_out` / `audio_proj_out`, renamed onto them).

Architecture facts, from diffusers' `MiniMaxH3Transformer3DModel` (`models/transformers/transformer_minimax_h3.py`), its
single-file converter `convert_minimax_h3_transformer_checkpoint_to_diffusers` and its scheduler
`scheduling_minimax_h3.py` (Apache-2.0; written from that description, nothing copied):

* inputs are diffusers' forward arguments: `hidden_states` [B, Nv, 96] (1x2x2 patches of the 24-channel latent, the rows
  of `video_indices`), `audio_hidden_states` [B, Na, 32], `encoder_hidden_states` [B, Nt, 5120], and one packed layout
  the batch shares: `timestep` [K] (the distinct noise levels, in 0-1 with 1 clean: t = 1 - sigma), `timestep_indices`
  and `token_tags` [S] (each row's level and modality: 0 video, 1 text, 2 audio), `position_ids` [S, 3] (t, h, w) and
  the rows of each modality (`video_indices`, `audio_indices`, `text_indices`).
* each modality is projected to the residual width (`video_patch_proj`, `audio_patch_proj`, `condition_proj`); the
  text first runs through the token refiner (plain pre-RMS-norm blocks, no rotation, then `final_norm`); the rows are
  scattered into one [B, S, D] sequence.
* e = `time_embedder` (Linear, SiLU, Linear) of the sinusoidal embedding (cosines first) of `timestep`, unscaled.
* block: (shift, scale, gate) x 2 = `adaln_proj.linear`(SiLU(e)) as [K x 3, 6 D], each row picked per sequence row by
  3 x level + modality; x += gate · attn(RMS(x)·(1 + scale) + shift), the same for the SwiGLU. Attention: the fused
  `qkv_proj` ([q; k; v], heads x head wider than D), per-head RMS q / k norms, the leading 6 x F channels of each head
  rotated (rotate-half) by the angles pos_axis · inv_freq of the three axes, concatenated twice; full attention over
  the whole packed sequence; `out_proj`. SwiGLU: fc2(SiLU(gate) · value), fc1 holding [gate; value] (diffusers'
  ff.net.0.proj the other way round, [value; gate]). Every RMS norm has eps 1e-5.
* out: (shift, scale) = `final_layer.adaln_proj.linear`(SiLU(e)) per level; RMS(x)·(1 + scale) + shift; the video rows
  through `final_layer.video_out`, the audio rows through `final_layer.audio_out`. The output is the data-ward
  velocity (x0 = x_t + sigma · v).
* rotary frequencies: the release file's `rope.inv_freq` where it holds one, else diffusers' default (16 per axis,
  theta 10000), 1 / theta^(2i / 32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import Ops, held, mlp2, rms_norm_with, timestep_embedding, wshape
from .flux import Proj

MODALITIES = 3  # video, text, audio
EPS = 1e-5  # norm_eps, qk_norm_eps and final_norm_eps of diffusers' config
ROPE_FREQS = 16  # rope_freq_dim
ROPE_THETA = 10000.0
INPUTS = ("hidden_states", "audio_hidden_states", "encoder_hidden_states", "timestep", "timestep_indices",
          "token_tags", "position_ids", "video_indices", "audio_indices", "text_indices")  # fmt: skip
# the packed layout's inputs: one for the whole batch, no batch axis
LAYOUT = INPUTS[3:]


@dataclass
class Block:
    """One block (a refiner block has no `ada`): norms, fused q / k / v, q / k norms, output, SwiGLU."""

    norm1: object
    qkv: Proj
    q_norm: object
    k_norm: object
    out: object
    norm2: object
    fc1: object
    fc2: object
    ada: object | None = None

    def ops(self) -> list:
        ada = [self.ada] if self.ada is not None else []
        return [
            *ada,
            self.norm1,
            *self.qkv.ops(),
            self.q_norm,
            self.k_norm,
            self.out,
            self.norm2,
            self.fc1,
            self.fc2,
        ]


@dataclass
class MiniMaxH3:
    """A bound MiniMax-H3 transformer: call it with diffusers' forward arguments; `outputs` gives the audio beside."""

    architecture: str
    video_in: object
    audio_in: object
    text_in: object
    time: tuple[object, object]
    refiner: list[Block]
    refiner_norm: object
    blocks: list[Block]
    final: tuple[object, object, object, object]  # norm, adaln_proj.linear, video_out, audio_out
    rope: object | None  # the release's plain holder of rope.inv_freq, where the file has one
    heads: int
    diffusers: bool  # diffusers' SwiGLU halves ([value; gate])
    dtype: torch.dtype = torch.float32
    family = "minimax_h3"
    unbatched = LAYOUT

    @property
    def in_channels(self) -> int:
        return wshape(self.video_in)[1]

    @property
    def audio_channels(self) -> int:
        return wshape(self.audio_in)[1]

    @property
    def context_dim(self) -> int:
        return wshape(self.text_in)[1]

    def __call__(self, **inputs) -> torch.Tensor:
        return self.outputs(**inputs)["out"]

    def outputs(self, hidden_states, audio_hidden_states, encoder_hidden_states, timestep, timestep_indices,
                token_tags, position_ids, video_indices, audio_indices, text_indices) -> dict:  # fmt: skip
        """{"out": the video rows' velocity [B, Nv, 96], "audio_out": the audio rows' [B, Na, 32]}."""
        dt, dev = self.dtype, hidden_states.device
        vi, ai, ti = (i.to(dev).long() for i in (video_indices, audio_indices, text_indices))
        levels = timestep_indices.to(dev).long()
        rows = levels * MODALITIES + token_tags.to(dev).long()
        text = self.text_in(encoder_hidden_states.to(dt))
        for blk in self.refiner:
            text = self._block(blk, text, None, None)
        text = rms_norm_with(self.refiner_norm, text, EPS)
        b, s = text.shape[0], position_ids.shape[0]
        x = text.new_zeros(b, s, text.shape[-1]).index_copy(1, ti, text)
        x = x.index_copy(1, vi, self.video_in(hidden_states.to(dt)).to(x.dtype))
        x = x.index_copy(1, ai, self.audio_in(audio_hidden_states.to(dt)).to(x.dtype))
        e = mlp2(self.time, timestep_embedding(timestep.to(dev), wshape(self.time[0])[1]).to(dt))
        se = F.silu(e)
        cos, sin = self._rope(position_ids.to(dev))
        for blk in self.blocks:
            x = self._block(blk, x, (se, rows), (cos, sin))
        norm, ada, video_out, audio_out = self.final
        x = rms_norm_with(norm, x, EPS)
        shift, scale = ada(se).chunk(2, dim=-1)
        x = x * (1 + scale.index_select(0, levels)) + shift.index_select(0, levels)
        return {"out": video_out(x.index_select(1, vi)), "audio_out": audio_out(x.index_select(1, ai))}

    def check_extra(self, got: dict, source: str) -> None:
        """The packed layout: as many rows as positions, each modality's rows where its tag says, every row once."""
        check_layout(got, source)

    def _rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [S, 6 F]: each axis' angles pos · inv_freq, the three axes concatenated, then twice (rotate-half)."""
        if self.rope is not None:
            inv = held(self.rope, "inv_freq", pos.device).to(pos.device, torch.float32)
        else:
            inv = 1.0 / ROPE_THETA ** (
                torch.arange(0, 2 * ROPE_FREQS, 2, device=pos.device) / (2 * ROPE_FREQS)
            )
        angles = (pos.float()[:, :, None] * inv).flatten(1)  # (t, h, w) blocks of F each
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    def _block(self, blk: Block, x, mod, rot):
        if mod is not None:
            se, rows = mod
            p = blk.ada(se).reshape(-1, 6 * x.shape[-1]).chunk(6, dim=-1)
            shift1, scale1, gate1, shift2, scale2, gate2 = (t.index_select(0, rows) for t in p)
            h = rms_norm_with(blk.norm1, x, EPS) * (1 + scale1) + shift1
            x = x + gate1 * self._attention(blk, h, rot)
            h = rms_norm_with(blk.norm2, x, EPS) * (1 + scale2) + shift2
            return x + gate2 * self._mlp(blk, h)
        x = x + self._attention(blk, rms_norm_with(blk.norm1, x, EPS), rot)
        return x + self._mlp(blk, rms_norm_with(blk.norm2, x, EPS))

    def _attention(self, blk: Block, h, rot):
        b, n = h.shape[:2]
        q, k, v = (t.reshape(b, n, self.heads, -1) for t in blk.qkv(h))
        q, k = rms_norm_with(blk.q_norm, q, EPS), rms_norm_with(blk.k_norm, k, EPS)
        if rot is not None:
            q, k = _rotate(q, *rot), _rotate(k, *rot)
        o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
        return blk.out(o.transpose(1, 2).flatten(2))

    def _mlp(self, blk: Block, h):
        a, b = blk.fc1(h).chunk(2, dim=-1)
        return blk.fc2(a * F.silu(b) if self.diffusers else F.silu(a) * b)

    def op_order(self) -> list:
        order = [self.text_in]
        for blk in self.refiner:
            order += blk.ops()
        order += [self.refiner_norm, self.video_in, self.audio_in, *self.time]
        for blk in self.blocks:
            order += blk.ops()
        return [*order, *self.final]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The leading cos.shape[-1] channels of each head of [B, S, heads, head] turned rotate-half style, the rest kept."""
    r = cos.shape[-1]
    xr = x[..., :r]
    a, b = xr.chunk(2, dim=-1)
    c, s = cos.to(x.dtype)[None, :, None], sin.to(x.dtype)[None, :, None]
    return torch.cat([xr * c + torch.cat([-b, a], dim=-1) * s, x[..., r:]], dim=-1)


# -- inputs ------------------------------------------------------------------------------------------------

TOKENS = 256  # text rows of a random step
AUDIO_ROWS = (
    7  # a random step's audio rows: one latent frame (4 frames at 24 fps) at the audio VAE's 40 latents/s
)
TAGS = {"video_indices": 0, "text_indices": 1, "audio_indices": 2}


def random_inputs(model: MiniMaxH3, h: int, w: int, batch: int, g: torch.Generator) -> dict:
    """One latent frame of h x w patches, `TOKENS` text rows and `AUDIO_ROWS` audio rows packed text, audio, video (its
    pipeline's order and positions: text on the time axis at its index, the media from there), the video and text at
    one noise level and the audio at another."""
    t, a, v = TOKENS, AUDIO_ROWS, h * w
    pos = torch.zeros(t + a + v, 3)
    pos[:t, 0] = torch.arange(t)
    pos[t : t + a, 0] = t + torch.arange(a)
    grid = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    pos[t + a :, 0] = t
    pos[t + a :, 1:] = torch.stack([c.reshape(-1) for c in grid], dim=-1)
    levels = torch.zeros(
        t + a + v, dtype=torch.long
    )  # rows and tags as integers (a card's bf16 would round them)
    levels[t : t + a] = 1
    tags = torch.ones(t + a + v, dtype=torch.long)
    tags[t : t + a], tags[t + a :] = 2, 0
    return {
        "hidden_states": torch.randn(batch, v, model.in_channels, generator=g),
        "audio_hidden_states": torch.randn(batch, a, model.audio_channels, generator=g),
        "encoder_hidden_states": torch.randn(batch, t, model.context_dim, generator=g),
        "timestep": torch.rand(2, generator=g),
        "timestep_indices": levels,
        "token_tags": tags,
        "position_ids": pos,
        "video_indices": torch.arange(t + a, t + a + v),
        "audio_indices": torch.arange(t, t + a),
        "text_indices": torch.arange(t),
    }


def input_shapes(model: MiniMaxH3, got: dict) -> dict:
    """The shape of each input (None: any size on that axis); the layout's have no batch axis."""

    def n(name: str):
        return got[name].shape[0] if name in got and got[name].dim() == 1 else None

    s = got["position_ids"].shape[0] if got["position_ids"].dim() == 2 else None
    return {"hidden_states": (None, n("video_indices"), model.in_channels),
            "audio_hidden_states": (None, n("audio_indices"), model.audio_channels),
            "encoder_hidden_states": (None, n("text_indices"), model.context_dim), "timestep": (None,),
            "timestep_indices": (s,), "token_tags": (s,), "position_ids": (None, 3), "video_indices": (None,),
            "audio_indices": (None,), "text_indices": (None,)}  # fmt: skip


def _rows(idx: torch.Tensor, n: int) -> bool:
    """Whether every value of `idx` is a whole number in [0, n)."""
    return not idx.numel() or bool((idx == idx.round()).all() and idx.min() >= 0 and idx.max() < n)


def check_layout(got: dict, source: str) -> None:
    """A FormatError unless the rows of the three modalities cover the packed sequence once, tagged as they are, and
    every row's level is one of `timestep`."""
    s, k = got["position_ids"].shape[0], got["timestep"].shape[0]
    seen = torch.zeros(s, dtype=torch.long)
    for name, tag in TAGS.items():
        idx = got[name]
        if not _rows(idx, s):
            raise FormatError(
                f"{source}: input {name} holds values that are not row numbers of the {s} packed rows"
            )
        rows = idx.long()
        seen.index_add_(0, rows, torch.ones_like(rows))
        if (got["token_tags"][rows] != tag).any():
            raise FormatError(f"{source}: input token_tags does not tag every row of {name} {tag} (0 video, 1 text, "
                              "2 audio)")  # fmt: skip
    if (seen != 1).any():
        raise FormatError(f"{source}: the rows of video_indices, audio_indices and text_indices must cover the {s} "
                          "packed rows, each once")  # fmt: skip
    if not _rows(got["timestep_indices"], k):
        raise FormatError(
            f"{source}: input timestep_indices holds values that are not indices into timestep ({k})"
        )


# -- binding the file's ops -----------------------------------------------------------------------------

# diffusers' paths -> the release's: the rename table LoRAs use too (engine.lora.family_names_dits.MINIMAX_H3), and what
# only the binder renames: the split q / k / v (bound as row blocks in place of the fused qkv_proj) and the SwiGLU's fc1
# (its halves swapped, read in diffusers' order)
_OWN_BLOCK = {"attn.to_q": "attn.q", "attn.to_k": "attn.k", "attn.to_v": "attn.v", "ff.net.0.proj": "mlp.fc1"}
_STACKS = {"transformer_blocks.": "blocks.", "token_refiner.refiner_blocks.": "token_refiner.blocks."}


def release_paths(mods) -> dict:
    """diffusers path -> the release's, for every path of `mods` the two names differ in."""
    from ..lora.family_names import to_original
    from ..lora.family_names_dits import MINIMAX_H3

    out = to_original(mods, MINIMAX_H3)
    for p in mods:
        for stack, native in _STACKS.items():
            if p.startswith(stack):
                i, rest = p[len(stack) :].split(".", 1)
                if rest in _OWN_BLOCK:
                    out[p] = f"{native}{i}.{_OWN_BLOCK[rest]}"
    return out


def bind_minimax_h3(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, MiniMaxH3]:
    """(naming, the forward) of a MiniMax-H3 transformer in the release's or diffusers' naming."""
    diffusers = "context_embedder" in mods
    if diffusers:
        rename = release_paths(mods)
        mods = {rename.get(p, p): m for p, m in mods.items()}
        ops = ops.renamed(mods)
    if "adaln_t_table" in mods or "" in mods and getattr(mods[""], "adaln_t_table", None) is not None:
        raise UnsupportedModel(
            f"{ops.what}: the pruned MiniMax-H3 checkpoint (a precomputed adaln_t_table in place of the timestep "
            "embedder) — use the unpruned one (MiniMaxAI/MiniMax-H3)"
        )
    rope = mods.get("rope")
    if rope is not None:
        ops.take(rope)

    def block(p: str, adaln: bool) -> Block:
        a = f"{p}.attn"
        qkv = Proj(ops[f"{a}.qkv_proj"], ()) if f"{a}.qkv_proj" in ops else None
        if qkv is None:  # diffusers' split q / k / v
            qkv = Proj(None, parts=tuple(ops[f"{a}.{n}"] for n in "qkv"))
        else:
            rows = wshape(qkv.fused)[0]
            qkv.sizes = (rows // 3,) * 3
        ada = ops[f"{p}.adaln_proj.linear"] if adaln else None
        return Block(ops[f"{p}.norm1"], qkv, ops[f"{a}.q_norm"], ops[f"{a}.k_norm"], ops[f"{a}.out_proj"],
                     ops[f"{p}.norm2"], ops[f"{p}.mlp.fc1"], ops[f"{p}.mlp.fc2"], ada)  # fmt: skip

    depth = ops.children("blocks")
    if not depth:
        raise UnsupportedModel(f"{ops.what}: no blocks — not a MiniMax-H3 transformer")
    blocks = [block(f"blocks.{i}", True) for i in depth]
    refiner = [block(f"token_refiner.blocks.{i}", False) for i in ops.children("token_refiner.blocks")]
    head = wshape(blocks[0].q_norm)[0]
    inner = wshape(blocks[0].out)[1]
    dim = wshape(ops["video_patch_proj"])[0]
    if inner % head or wshape(blocks[0].ada)[0] != 6 * MODALITIES * dim:
        raise UnsupportedModel(
            f"{ops.what}: attention {inner} wide in heads of {head}, AdaLN rows {wshape(blocks[0].ada)[0]} for width "
            f"{dim}: not MiniMax-H3's 6 x 3 modulations per row of its per-head attention"
        )
    if rope is None and head < 6 * ROPE_FREQS:
        raise UnsupportedModel(
            f"{ops.what}: heads of {head} channels, fewer than the {6 * ROPE_FREQS} diffusers' default rotary "
            "frequencies turn, and no rope.inv_freq in the file to say its own: a diffusers-named file of another "
            "rope_freq_dim (its config.json's) Loadout cannot read from the weights"
        )
    final = tuple(ops[f"final_layer.{n}"] for n in ("norm", "adaln_proj.linear", "video_out", "audio_out"))
    model = MiniMaxH3(
        architecture, ops["video_patch_proj"], ops["audio_patch_proj"], ops["condition_proj"],
        (ops["time_embedder.proj_in"], ops["time_embedder.proj_out"]), refiner, ops["token_refiner.final_norm"],
        blocks, final, rope, inner // head, diffusers, dtype,
    )  # fmt: skip
    return ("diffusers" if diffusers else "release"), model
