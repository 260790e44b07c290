"""GLM-Image's diffusion transformer forward pass (Zhipu AI, 2026), run on the component's own castable ops. Its release
(zai-org/GLM-Image's `transformer/`) holds diffusers' own module names (`GlmImageTransformer2DModel`; no single-file
converter), bare or under a `model.diffusion_model.` / `transformer.` prefix (detection strips it).

Architecture facts, from diffusers' `transformer_glm_image.py` and `pipelines/glm_image` (read for the facts, written
from that description, nothing copied):

* Image tokens: `image_projector.proj`, a Linear over 2×2 patches of the 16-channel latent (channels outer, then the
  patch's rows and columns), plus the autoregressive prior's image tokens: `prior_token_embedding` (a 16384-entry
  codebook; one token per patch, the AR model's 32-pixel grid upsampled 2× by the pipeline), zeroed where
  `prior_token_drop` is set (the unconditional pass drops all), through `prior_projector` (net.0.proj, SiLU, net.2).
  Text tokens: `glyph_projector` (net.0.proj, exact GELU, net.2) of the glyph encoder's states (ByT5, 1472 wide).
* Conditioning: the sinusoidal embedding (cosines first) of t, 512 wide → `time_condition_embed.timestep_embedder`
  (linear_1, SiLU, linear_2), plus `condition_embedder` (linear_1, SiLU, linear_2) of the 256-wide embeddings of the
  crop's top and left then the target's height and width (SDXL's size conditions); c = SiLU(sum).
* Block (`transformer_blocks.N`): `norm1.linear`(c) = 12 chunks, image and text interleaved: shift, c_shift, scale,
  c_scale, gate, c_gate for the attention, then the same six for the MLP. Affine-free LayerNorms (eps 1e-5) modulated
  (1 + scale)·n + shift per stream; one joint attention over [text, image] (`attn1.to_q/k/v` with biases, affine-free
  per-head LayerNorms on q and k, eps 1e-5, RoPE on the image tokens only, `attn1.to_out.0`); the streams add their
  gated halves; then one MLP shared by both streams (`ff.net.0.proj`, tanh GELU, `ff.net.2`), gated per stream.
* RoPE (theta 10000, heads of 40: diffusers' default config, 64 heads): angles of the patch's row over the first
  quarter of the head's frequencies and of its column over the second, the list repeated twice and applied to the
  head's halves (x·cos + [−x2, x1]·sin), in float32.
* Out: (scale, shift) = `norm_out.linear`(c) — no further SiLU —, (1 + scale)·LN(x) + shift, `proj_out`, unpatched.

Inputs (diffusers' GlmImageTransformer2DModel.forward): `hidden_states` [B, 16, h, w] (the latent, an 8th of the
pixels, h and w even), `encoder_hidden_states` [B, T, 1472] (the quoted glyph text's ByT5 states, left-padded with
zeros to the longest prompt: the pipeline passes no mask), `prior_token_id` [B, h/2 · w/2] (the prior's codebook ids,
one per patch, row by row), `prior_token_drop` [B, h/2 · w/2] (1 where the prior token is dropped), `timestep` [B] in
0–999 (the scheduler's t − 1), `target_size` [B, 2] (height, width in pixels) and `crop_coords` [B, 2] (top, left;
the pipeline's 0, 0). Not taken: diffusers' `attention_mask` (its pipeline never passes one) and the image-edit mode's
key / value cache of the condition images (`kv_caches`). A self-described family (engine.denoise.SELF_DESCRIBED).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import Ops, merge_heads, mlp2, split_heads, timestep_embedding, wshape

HEAD = 40  # attention_head_dim of diffusers' default (the release's) config
THETA = 10000.0
EPS = 1e-5
PATCH = 2
TOKENS = 64  # a random step's glyph tokens
LATENT_PX = 8  # the VAE's downscale


@dataclass
class Block:
    """One joint block: its modulation, attention projections and the MLP both streams share."""

    mod: object
    q: object
    k: object
    v: object
    o: object
    ff_in: object
    ff_out: object

    def ops(self) -> list:
        return [self.mod, self.q, self.k, self.v, self.o, self.ff_in, self.ff_out]


@dataclass
class GlmImage:
    """A bound GLM-Image transformer: call it with diffusers' forward's inputs (module docstring)."""

    architecture: str
    image_proj: object
    glyph: tuple[object, object]
    prior_embedding: object
    prior: tuple[object, object]
    time_mlp: tuple[object, object]
    cond_mlp: tuple[object, object]
    blocks: list[Block]
    final_mod: object
    proj_out: object
    dtype: torch.dtype = torch.float32
    family = "glm_image"
    step_inputs = ("hidden_states", "encoder_hidden_states", "prior_token_id", "prior_token_drop", "timestep",
                   "target_size", "crop_coords")  # fmt: skip
    step_optional = ()

    @property
    def hidden(self) -> int:
        return wshape(self.image_proj)[0]

    @property
    def heads(self) -> int:
        return self.hidden // HEAD

    @property
    def in_channels(self) -> int:
        return wshape(self.image_proj)[1] // (PATCH * PATCH)

    @property
    def context_dim(self) -> int:
        return wshape(self.glyph[0])[1]

    @property
    def codebook(self) -> int:
        return wshape(self.prior_embedding)[0]

    def __call__(self, hidden_states, encoder_hidden_states, prior_token_id, prior_token_drop, timestep, target_size,
                 crop_coords) -> torch.Tensor:  # fmt: skip
        dt = self.dtype
        b, _, h, w = hidden_states.shape
        hp, wp = h // PATCH, w // PATCH
        patches = hidden_states.to(dt).reshape(b, -1, hp, PATCH, wp, PATCH).permute(0, 2, 4, 1, 3, 5)
        img = self.image_proj(patches.reshape(b, hp * wp, -1))
        txt = self.glyph[1](F.gelu(self.glyph[0](encoder_hidden_states.to(dt))))
        prior = self.prior_embedding(prior_token_id.round().long().to(img.device)).to(dt)
        prior = torch.where(prior_token_drop.to(img.device)[..., None] != 0, torch.zeros_like(prior), prior)
        img = img + mlp2(self.prior, prior)
        c = self._conditioning(timestep, target_size, crop_coords, img.device)
        cos, sin = _rope(hp, wp, img.device)
        for block in self.blocks:
            img, txt = self._block(block, img, txt, c, cos, sin)
        scale, shift = self.final_mod(c).chunk(2, dim=-1)
        out = self.proj_out(_ln(img) * (1 + scale[:, None]) + shift[:, None])  # [B, hp·wp, C·p·p]
        out = out.reshape(b, hp, wp, -1, PATCH, PATCH).permute(0, 3, 1, 4, 2, 5)
        return out.reshape(b, -1, h, w)

    def _conditioning(self, timestep, target_size, crop_coords, device) -> torch.Tensor:
        """SiLU(time embedding + size-condition embedding), [B, 512]."""
        dt, b = self.dtype, timestep.shape[0]
        t = timestep_embedding(timestep.float().to(device), wshape(self.time_mlp[0])[1]).to(dt)
        width = wshape(self.cond_mlp[0])[1] // 4  # four numbers, each its own sinusoid
        sizes = torch.cat([crop_coords, target_size], dim=1).float().to(device)  # top, left, height, width
        s = timestep_embedding(sizes.reshape(-1), width).reshape(b, -1).to(dt)
        return F.silu(mlp2(self.time_mlp, t) + mlp2(self.cond_mlp, s))

    def _block(self, block: Block, img, txt, c, cos, sin):
        m = [x[:, None] for x in block.mod(c).chunk(12, dim=-1)]
        n_img = _ln(img) * (1 + m[2]) + m[0]
        n_txt = _ln(txt) * (1 + m[3]) + m[1]
        t_len = txt.shape[1]
        x = torch.cat([n_txt, n_img], dim=1)
        q, k, v = (split_heads(p(x), self.heads) for p in (block.q, block.k, block.v))
        q, k = (
            torch.cat([t[:, :, :t_len], _rotate(t[:, :, t_len:], cos, sin)], dim=2) for t in (_ln(q), _ln(k))
        )
        o = block.o(merge_heads(F.scaled_dot_product_attention(q, k, v)))
        img = img + o[:, t_len:] * m[4]
        txt = txt + o[:, :t_len] * m[5]
        n = torch.cat([_ln(txt) * (1 + m[9]) + m[7], _ln(img) * (1 + m[8]) + m[6]], dim=1)
        f = block.ff_out(F.gelu(block.ff_in(n), approximate="tanh"))  # one call for both streams' tokens
        return img + f[:, t_len:] * m[10], txt + f[:, :t_len] * m[11]

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """A text-to-image step at width × height pixels (one patch per 16), TOKENS glyph tokens, the prior's tokens
        kept, t in 0–999, the pipeline's size conditions."""
        from .random_inputs import _latent

        hp, wp = _latent(width, height, LATENT_PX * PATCH)
        return {
            "hidden_states": torch.randn(batch, self.in_channels, PATCH * hp, PATCH * wp, generator=g),
            "encoder_hidden_states": torch.randn(batch, TOKENS, self.context_dim, generator=g),
            "prior_token_id": torch.randint(0, self.codebook, (batch, hp * wp), generator=g).float(),
            "prior_token_drop": torch.zeros(batch, hp * wp),
            "timestep": torch.rand(batch, generator=g) * 999.0,
            "target_size": torch.tensor([[float(height), float(width)]]).expand(batch, 2).clone(),
            "crop_coords": torch.zeros(batch, 2),
        }

    def step_units(self, inputs: dict) -> int:
        """Image tokens, the batch's (what its activations grow with; engine.stepping)."""
        b, _, h, w = inputs["hidden_states"].shape
        return b * (h // PATCH) * (w // PATCH)

    def step_shapes(self, got: dict) -> dict:
        """The shape of each input (None: any size on that axis)."""
        x = got.get("hidden_states")
        tokens = (x.shape[-2] // PATCH) * (x.shape[-1] // PATCH) if x is not None and x.dim() == 4 else None
        return {"hidden_states": (None, self.in_channels, None, None), "encoder_hidden_states": (None, None,
                self.context_dim), "prior_token_id": (None, tokens), "prior_token_drop": (None, tokens),
                "timestep": (None,), "target_size": (None, 2), "crop_coords": (None, 2)}  # fmt: skip

    def check_extra(self, got: dict, source: str) -> None:
        """The latent is whole patches; the prior's ids are codebook entries and its drop flags 0 or 1."""
        h, w = got["hidden_states"].shape[-2:]
        if h % PATCH or w % PATCH:
            raise FormatError(
                f"{source}: input hidden_states is {h}×{w}; the model reads 2×2 patches (h, w even)"
            )
        ids = got["prior_token_id"]
        if ((ids != ids.round()) | (ids < 0) | (ids >= self.codebook)).any():
            raise FormatError(
                f"{source}: input prior_token_id holds values that are not ids of the prior's codebook "
                f"(whole numbers, 0 to {self.codebook - 1})"
            )
        drop = got["prior_token_drop"]
        if not ((drop == 0) | (drop == 1)).all():
            raise FormatError(f"{source}: input prior_token_drop holds values other than 0 and 1")

    def op_order(self) -> list:
        # the prior's embedding table is read whole by F.embedding, not fetched: not in the streamer's order
        order = [self.image_proj, *self.glyph, *self.prior, *self.time_mlp, *self.cond_mlp]
        for block in self.blocks:
            order += block.ops()
        return [*order, self.final_mod, self.proj_out]


def _ln(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), eps=EPS)


def _rope(hp: int, wp: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [hp·wp, HEAD] in float32: [row angles, column angles] twice, each axis HEAD/4 frequencies
    theta^(-2i / (HEAD/2))."""
    half = HEAD // 2
    omega = 1.0 / THETA ** (
        torch.arange(0, half, 2, dtype=torch.float32, device=device) / half
    )  # as diffusers rounds it
    rows = torch.arange(hp, device=device, dtype=torch.float32)[:, None, None] * omega
    cols = torch.arange(wp, device=device, dtype=torch.float32)[None, :, None] * omega
    a = torch.cat([rows.expand(hp, wp, -1), cols.expand(hp, wp, -1)], dim=-1).reshape(hp * wp, -1)
    a = torch.cat([a, a], dim=-1)
    return a.cos(), a.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return (x.float() * cos + torch.cat([-x2, x1], dim=-1).float() * sin).to(x.dtype)


# -- binding the file's ops -----------------------------------------------------------------------------

_BLOCK = (
    "norm1.linear",
    "attn1.to_q",
    "attn1.to_k",
    "attn1.to_v",
    "attn1.to_out.0",
    "ff.net.0.proj",
    "ff.net.2",
)


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, GlmImage]:
    """The forward of a GLM-Image transformer in diffusers' names (the release's)."""
    blocks = [
        Block(*(ops[f"transformer_blocks.{i}.{n}"] for n in _BLOCK))
        for i in ops.children("transformer_blocks")
    ]
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no GLM-Image transformer blocks")
    proj = ops["image_projector.proj"]
    hidden, patch_in = wshape(proj)
    if hidden % HEAD or patch_in % (PATCH * PATCH):
        raise UnsupportedModel(
            f"{ops.what}: hidden size {hidden}, {patch_in} patch inputs — GLM-Image's heads are {HEAD} wide and its "
            f"patches {PATCH}×{PATCH}"
        )
    e = "time_condition_embed."
    return "diffusers", GlmImage(
        architecture, proj, (ops["glyph_projector.net.0.proj"], ops["glyph_projector.net.2"]),
        ops["prior_token_embedding"], (ops["prior_projector.net.0.proj"], ops["prior_projector.net.2"]),
        (ops[e + "timestep_embedder.linear_1"], ops[e + "timestep_embedder.linear_2"]),
        (ops[e + "condition_embedder.linear_1"], ops[e + "condition_embedder.linear_2"]), blocks,
        ops["norm_out.linear"], ops["proj_out"], dtype,
    )  # fmt: skip
