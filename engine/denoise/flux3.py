"""FLUX.3's transformer forward pass (Black Forest Labs, 2026; base and step-distilled flow map), run on the
component's own castable ops, in the file's own naming: BFL's (`content_mode_blocks`, `single_blocks.N.q_proj`,
`early_stream_modulations.image.lin`) or diffusers' (`Flux3Transformer2DModel`: `mode_blocks`,
`single_transformer_blocks.N.attn.to_q`, renamed onto BFL's).

Architecture facts, from diffusers' `transformer_flux3.py`, its single-file converter
`convert_flux3_transformer_checkpoint_to_diffusers` and its `modular_pipelines/flux3` (read for the facts, written
from that description, nothing copied):

* Three token modes: the noisy image tokens (`emb_in.image`, 2×2 patches of the latent, 128 wide), the optional clean
  reference image tokens (`emb_in.image_cond`) and the text (`txt_in`: 8 stacked Qwen3-VL layers, 20480 wide). Every
  Linear is bias-free.
* Time: the 256-wide sinusoidal embedding (cosines first) of 1000·t → `time_in` (in_layer, SiLU, out_layer) = e_t for
  the image tokens, and the same of t = 0 = e_0 for the text and the reference tokens. A flow map (the step-distilled
  checkpoints) embeds the time the step jumps to with `ref_time_in` and adds it to both.
* Per-mode modulation, shared by the blocks of a stage: (shift, scale, gate) = `early_stream_modulations.<mode>.lin`
  (SiLU(e)) for the per-mode blocks and `single_stream_modulations.<mode>.lin`(SiLU(e)) for the joint ones; the image
  mode reads e_t, `image_cond` and `txt` read e_0.
* Per-mode blocks (`txt_mode_blocks.N`, `content_mode_blocks.{image,image_cond}.N`): each mode attends within itself
  only; x += gate · (attn(n) + mlp(n)), n = (1 + scale)·LN(x) + shift (affine-free LayerNorm, eps 1e-6); the
  attention and the MLP read the same n (a parallel block).
* Joint single blocks (`single_blocks.N`): the same parallel block over [text, image, reference] with each mode's
  own (shift, scale, gate).
* Attention: separate q / k / v (`q_proj`, `k_proj`, `v_proj`), 128-wide heads, RMS QK norms (`norm.query_norm`,
  `norm.key_norm`, eps 1e-6) and RoPE computed in float32, cast back once; `attn_out`. MLP: SwiGLU (`mlp_in` 2·m
  wide, SiLU(first half)·second half, `mlp_out`; m = 3·hidden).
* RoPE on interleaved pairs (FLUX's), 4 axes (t, h, w, l) of 32 dims, theta 10000. The pipeline's ids: image tokens
  at (0, 0.5·row, 0.5·column, 0) (its image RoPE scale 0.5), the i-th reference image's at l = −(1 + i), text tokens
  at (0, 0, 0, i).
* Out (image tokens only): (shift, scale) = `final_layer.image.adaLN_modulation.1`(SiLU(e_t)) (diffusers'
  `norm_out.linear` holds the halves the other way round), `final_layer.image.linear`((1 + scale)·LN(x) + shift).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import Ops, layer_norm, merge_heads, mlp2, rope, split_heads, timestep_embedding, wshape
from .flux import rope_table

AXES = (32, 32, 32, 32)
THETA = 10000.0
EPS = 1e-6
TIME_FACTOR = 1000.0
IMAGE_ROPE_SCALE = 0.5  # the pipeline's scale of the image tokens' h / w positions
MODES = ("image", "image_cond", "txt")


@dataclass
class Block:
    """A parallel block (per-mode or joint): q, k, v, their norms, the attention's output, the SwiGLU MLP."""

    q: object
    k: object
    v: object
    q_norm: object
    k_norm: object
    o: object
    mlp_in: object
    mlp_out: object

    def ops(self) -> list:
        return [self.q, self.k, self.v, self.q_norm, self.k_norm, self.o, self.mlp_in, self.mlp_out]


@dataclass
class Flux3:
    """A bound FLUX.3 transformer: call it with hidden_states [B, L, C], encoder_hidden_states [B, T, D], timestep [B]
    (0–1), img_ids [B, L, 4], txt_ids [B, T, 4] [, image_cond_hidden_states [B, L', C'], image_cond_ids [B, L', 4]]
    [, target_timestep [B] for a flow map]."""

    architecture: str
    emb_in: dict  # mode -> Linear (image, image_cond)
    txt_in: object
    time_in: tuple[object, object]
    ref_time_in: tuple[object, object] | None
    early: dict  # mode -> modulation Linear
    single_mods: dict
    mode_blocks: dict  # mode -> [Block] (image, image_cond, txt)
    singles: list[Block]
    final_mod: object
    final_swapped: bool  # diffusers' norm_out.linear: (scale, shift)
    final_linear: object
    heads: int
    dtype: torch.dtype = torch.float32
    family = "flux3"

    @property
    def in_channels(self) -> int:
        return wshape(self.emb_in["image"])[1]

    @property
    def cond_channels(self) -> int:
        return wshape(self.emb_in["image_cond"])[1]

    @property
    def context_dim(self) -> int:
        return wshape(self.txt_in)[1]

    @property
    def flow_map(self) -> bool:
        return self.ref_time_in is not None

    def _temb(self, pair, t, dt):
        return mlp2(pair, timestep_embedding(TIME_FACTOR * t.float(), 256).to(dt))[:, None]  # [B, 1, D]

    def __call__(
        self, hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids,
        image_cond_hidden_states=None, image_cond_ids=None, target_timestep=None,
    ) -> torch.Tensor:  # fmt: skip
        dt = self.dtype
        if (target_timestep is not None) != self.flow_map:
            raise FormatError(
                "a step-distilled FLUX.3 (flow map) takes target_timestep, and only it does"
                if self.flow_map
                else "target_timestep is an input of the step-distilled FLUX.3 (flow map) only"
            )
        both = torch.cat([timestep, torch.zeros_like(timestep)])  # e_t and e_0 in one pass through time_in
        e_img, e_zero = self._temb(self.time_in, both, dt).chunk(2)
        if target_timestep is not None:
            e_target = self._temb(self.ref_time_in, target_timestep, dt)
            e_img, e_zero = e_img + e_target, e_zero + e_target
        act = {"image": F.silu(e_img), "txt": F.silu(e_zero), "image_cond": F.silu(e_zero)}
        seqs = {
            "txt": self.txt_in(encoder_hidden_states.to(dt)),
            "image": self.emb_in["image"](hidden_states.to(dt)),
        }
        ids = {"txt": txt_ids, "image": img_ids}
        if image_cond_hidden_states is not None:
            seqs["image_cond"] = self.emb_in["image_cond"](image_cond_hidden_states.to(dt))
            ids["image_cond"] = image_cond_ids
        modes = [m for m in ("txt", "image", "image_cond") if m in seqs]  # the joint sequence's order
        pe = {m: rope_table(ids[m], AXES, THETA) for m in modes}
        for m in modes:  # each mode through its own blocks, attending within itself
            mod = self.early[m](act[m]).chunk(3, dim=-1)
            for blk in self.mode_blocks[m]:
                seqs[m] = self._block(blk, seqs[m], mod, pe[m])
        mods = [self.single_mods[m](act[m]).chunk(3, dim=-1) for m in modes]
        lengths = [seqs[m].shape[1] for m in modes]
        joint_pe = torch.cat([pe[m] for m in modes], dim=2)
        xs = [seqs[m] for m in modes]
        del seqs
        for blk in self.singles:
            normed = torch.cat(
                [(1 + s[1]) * layer_norm(x) + s[0] for x, s in zip(xs, mods, strict=True)], dim=1
            )
            out = self._attn(blk, normed, joint_pe) + self._mlp(blk, normed)
            xs = [x + s[2] * o for x, s, o in zip(xs, mods, out.split(lengths, dim=1), strict=True)]
        x = xs[modes.index("image")]
        shift, scale = self.final_mod(act["image"]).chunk(2, dim=-1)
        if self.final_swapped:
            shift, scale = scale, shift
        return self.final_linear((1 + scale) * layer_norm(x) + shift)

    def _block(self, blk: Block, x, mod, pe):
        shift, scale, gate = mod
        n = (1 + scale) * layer_norm(x) + shift
        return x + gate * (self._attn(blk, n, pe) + self._mlp(blk, n))

    @staticmethod
    def _mlp(blk: Block, n):
        a, b = blk.mlp_in(n).chunk(2, dim=-1)
        return blk.mlp_out(F.silu(a) * b)

    def _attn(self, blk: Block, n, pe):
        q, k, v = (split_heads(p(n), self.heads) for p in (blk.q, blk.k, blk.v))
        q, k = _qk_norm(blk.q_norm, q), _qk_norm(blk.k_norm, k)  # float32, as the release computes them
        q, k = rope(q, pe).to(v.dtype), rope(k, pe).to(v.dtype)
        return blk.o(merge_heads(F.scaled_dot_product_attention(q, k, v)))

    def check_extra(self, got: dict, source: str) -> None:
        """The reference image's tokens and their ids come together."""
        if ("image_cond_hidden_states" in got) != ("image_cond_ids" in got):
            raise FormatError(
                f"{source}: image_cond_hidden_states and image_cond_ids come together (one is missing)"
            )

    def op_order(self) -> list:
        """The call order of a step with a reference image (without one, its ops are skipped)."""
        order = [
            *self.time_in,
            *(self.ref_time_in or ()),
            self.txt_in,
            self.emb_in["image"],
            self.emb_in["image_cond"],
        ]
        for m in ("txt", "image", "image_cond"):
            order.append(self.early[m])
            for blk in self.mode_blocks[m]:
                order += blk.ops()
        order += [self.single_mods[m] for m in ("txt", "image", "image_cond")]
        for blk in self.singles:
            order += blk.ops()
        return [*order, self.final_mod, self.final_linear]


def _qk_norm(op, x: torch.Tensor) -> torch.Tensor:
    """RMS norm of each head in float32 with the op's scale (cast, patched and streamed as its own forward would)."""
    x = x.float()
    w = op.cast_params(x)[0]
    return F.rms_norm(x, (x.shape[-1],), w.float(), EPS)


# -- binding the file's ops -----------------------------------------------------------------------------

# diffusers' paths -> BFL's: the one rename table LoRAs use too (engine.lora.family_names.FLUX3), and the final adaLN,
# whose halves diffusers swaps (a LoRA reaches it through a swap view; the forward reads it in diffusers' order)
_FINAL = {"norm_out.linear": "final_layer.image.adaLN_modulation.1"}


def bind_flux3(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, Flux3]:
    """(naming, the forward) of a FLUX.3 transformer in BFL's or diffusers' naming."""
    diffusers = "x_embedders.image" in mods or "context_embedder" in mods
    if diffusers:
        from ..lora.family_names import FLUX3, to_original

        rename = to_original(mods, FLUX3) | _FINAL
        ops = ops.renamed({rename.get(p, p): m for p, m in mods.items()})
    for p, m in mods.items():  # training-only REPA heads (diffusers' converter drops them): not run
        if p.startswith("repa_projectors."):
            ops.take(m)

    def block(p: str) -> Block:
        names = (
            "q_proj",
            "k_proj",
            "v_proj",
            "norm.query_norm",
            "norm.key_norm",
            "attn_out",
            "mlp_in",
            "mlp_out",
        )
        return Block(*(ops[f"{p}.{n}"] for n in names))

    def stack(p: str) -> list[Block]:
        return [block(f"{p}.{i}") for i in ops.children(p)]

    blocks = {m: stack(f"content_mode_blocks.{m}") for m in ("image", "image_cond")}
    blocks["txt"] = stack("txt_mode_blocks")
    singles = stack("single_blocks")
    if not singles and not blocks["image"]:
        raise UnsupportedModel(f"{ops.what}: no FLUX.3 blocks")
    hidden = wshape(ops["emb_in.image"])[0]
    head = wshape((singles or blocks["image"])[0].q_norm)[0]
    if head != sum(AXES) or hidden % head:
        raise UnsupportedModel(
            f"{ops.what}: head width {head} with hidden size {hidden} — FLUX.3's heads are {sum(AXES)} wide "
            f"(RoPE axes {AXES})"
        )
    ref = ("ref_time_in.in_layer", "ref_time_in.out_layer")
    model = Flux3(
        architecture, {m: ops[f"emb_in.{m}"] for m in ("image", "image_cond")}, ops["txt_in"],
        (ops["time_in.in_layer"], ops["time_in.out_layer"]),
        (ops[ref[0]], ops[ref[1]]) if ref[0] in ops else None,
        {m: ops[f"early_stream_modulations.{m}.lin"] for m in MODES},
        {m: ops[f"single_stream_modulations.{m}.lin"] for m in MODES}, blocks, singles,
        ops["final_layer.image.adaLN_modulation.1"], diffusers, ops["final_layer.image.linear"], hidden // head, dtype,
    )  # fmt: skip
    return ("diffusers" if diffusers else "bfl"), model


def image_ids(h: int, w: int, axis_l: float = 0.0) -> torch.Tensor:
    """[h·w, 4] positions of an image's h × w tokens as the pipeline gives them: (0, 0.5·row, 0.5·column, l)."""
    ids = torch.zeros(h, w, 4)
    ids[..., 1] = IMAGE_ROPE_SCALE * torch.arange(h)[:, None]
    ids[..., 2] = IMAGE_ROPE_SCALE * torch.arange(w)[None, :]
    ids[..., 3] = axis_l
    return ids.reshape(h * w, 4)


def random_inputs(model: Flux3, h: int, w: int, tokens: int, batch: int, g: torch.Generator) -> dict:
    """An image-to-image step on an h × w grid of tokens: the target, one reference image of its size (so every layer
    of the file computes), `tokens` text tokens, t in 0–1 (and, for a flow map, the time it jumps to, below t)."""
    txt_ids = torch.zeros(tokens, 4)
    txt_ids[:, 3] = torch.arange(tokens)
    t = torch.rand(batch, generator=g)
    out = {
        "hidden_states": torch.randn(batch, h * w, model.in_channels, generator=g),
        "encoder_hidden_states": torch.randn(batch, tokens, model.context_dim, generator=g),
        "timestep": t,
        "img_ids": image_ids(h, w).expand(batch, -1, -1).clone(),
        "txt_ids": txt_ids.expand(batch, -1, -1).clone(),
        "image_cond_hidden_states": torch.randn(batch, h * w, model.cond_channels, generator=g),
        "image_cond_ids": image_ids(h, w, -1.0).expand(batch, -1, -1).clone(),
    }
    if model.flow_map:
        out["target_timestep"] = t * torch.rand(batch, generator=g)
    return out


def input_shapes(model: Flux3, got: dict) -> dict:
    """The shape of each input (None: any size on that axis)."""

    def n(name: str):
        return got[name].shape[1] if name in got and got[name].dim() == 3 else None

    out = {"hidden_states": (None, None, model.in_channels), "encoder_hidden_states": (None, None, model.context_dim),
           "timestep": (None,), "img_ids": (None, n("hidden_states"), 4), "txt_ids": (None, n("encoder_hidden_states"), 4)}  # fmt: skip
    if model.flow_map:
        out["target_timestep"] = (None,)
    if "image_cond_hidden_states" in got:
        out["image_cond_hidden_states"] = (None, None, model.cond_channels)
    if "image_cond_ids" in got:
        out["image_cond_ids"] = (None, n("image_cond_hidden_states"), 4)
    return out
