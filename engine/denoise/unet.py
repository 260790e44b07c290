"""The LDM/SGM UNet's forward pass (SD1, SD2, SDXL and its refiner, any input channels: inpainting's 9),
run on the component's own castable ops in the LDM key layout.

Architecture facts, from CompVis/stable-diffusion and Stability-AI/generative-models
(`ldm|sgm/modules/diffusionmodules/openaimodel.py`, `ldm|sgm/modules/attention.py`), written here
from that description (nothing copied):

* time: a `model_channels`-wide sinusoidal embedding of the timestep (cosines first) through
  `time_embed` (Linear, SiLU, Linear); with an ADM input (`label_emb.0`, SDXL's 2816-wide `y`) the
  same MLP shape over `y` is added.
* input blocks run in order, each output kept for a skip; the middle block; output blocks each start
  by concatenating the last kept skip on the channel axis; then `out` = GroupNorm, SiLU, 3×3 conv.
* ResBlock: GroupNorm, SiLU, 3×3 conv; + Linear(SiLU(emb)) per channel; GroupNorm, SiLU, (dropout),
  3×3 conv; plus the input, through a 1×1 `skip_connection` when the channel count changes.
* Downsample is a 3×3 conv of stride 2 and padding 1 (`op`); Upsample is nearest ×2 then a 3×3 conv.
* SpatialTransformer: GroupNorm(32, eps 1e-6), `proj_in` (1×1 conv, or Linear after flattening when
  `use_linear_in_transformer`: SD2, SDXL), BasicTransformerBlocks — x += attn1(norm1 x);
  x += attn2(norm2 x, context); x += ff(norm3 x) with a GEGLU feed-forward (exact GELU) — then
  `proj_out` and the residual.
* Head counts are not in the weights: SD1 uses `num_heads: 8` (v1-inference.yaml); SD2 and SDXL
  (base and refiner) use `num_head_channels: 64` (v2-inference*.yaml, sd_xl_base.yaml,
  sd_xl_refiner.yaml), i.e. channels // 64 heads.
* SD2 computes attention scores in float32 (`ATTN_PRECISION` "fp32" in its attention.py; diffusers'
  `upcast_attention`): done here when the compute dtype is float16.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .common import Ops, attention, timestep_embedding, wshape

HEAD_CHANNELS = 64
SD1_HEADS = 8
TRANSFORMER_NORM_EPS = 1e-6


def heads_for(architecture: str, channels: int) -> int:
    """Attention heads of a transformer over `channels` (facts of the original configs; see above)."""
    if architecture == "sd1":
        return SD1_HEADS
    return max(1, channels // HEAD_CHANNELS)


@dataclass
class ResBlock:
    in_norm: object
    in_conv: object
    emb: object
    out_norm: object
    out_conv: object
    skip: object | None

    def __call__(self, x: torch.Tensor, emb_silu: torch.Tensor) -> torch.Tensor:
        h = self.in_conv(F.silu(self.in_norm(x)))
        h = h + self.emb(emb_silu).to(h.dtype)[:, :, None, None]
        h = self.out_conv(F.silu(self.out_norm(h)))
        return (self.skip(x) if self.skip is not None else x) + h

    def ops(self) -> list:
        return [self.in_norm, self.in_conv, self.emb, self.out_norm, self.out_conv, self.skip]


@dataclass
class Attention:
    q: object
    k: object
    v: object
    out: object
    heads: int
    upcast: bool = False

    def __call__(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        src = x if context is None else context
        q, k, v = self.q(x), self.k(src), self.v(src)
        if self.upcast:
            o = attention(q.float(), k.float(), v.float(), self.heads).to(x.dtype)
        else:
            o = attention(q, k, v, self.heads)
        return self.out(o)

    def ops(self) -> list:
        return [self.q, self.k, self.v, self.out]


@dataclass
class Block:
    norm1: object
    attn1: Attention
    norm2: object
    attn2: Attention
    norm3: object
    ff_in: object
    ff_out: object

    def __call__(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context) + x
        h, gate = self.ff_in(self.norm3(x)).chunk(2, dim=-1)  # GEGLU
        return self.ff_out(h * F.gelu(gate)) + x

    def ops(self) -> list:
        return [
            self.norm1,
            *self.attn1.ops(),
            self.norm2,
            *self.attn2.ops(),
            self.norm3,
            self.ff_in,
            self.ff_out,
        ]


@dataclass
class Transformer:
    norm: object
    proj_in: object
    blocks: list[Block]
    proj_out: object
    linear: bool

    def __call__(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, _, hh, ww = x.shape
        h = self.norm(x)
        if not self.linear:
            h = self.proj_in(h)
        h = h.permute(0, 2, 3, 1).reshape(b, hh * ww, -1)
        if self.linear:
            h = self.proj_in(h)
        for blk in self.blocks:
            h = blk(h, context)
        if self.linear:
            h = self.proj_out(h)
        h = h.reshape(b, hh, ww, -1).permute(0, 3, 1, 2).contiguous()
        if not self.linear:
            h = self.proj_out(h)
        return h + x

    def ops(self) -> list:
        return [self.norm, self.proj_in, *(o for b in self.blocks for o in b.ops()), self.proj_out]


@dataclass
class Resample:
    """`op` (a stride-2 conv) going down, or nearest ×2 and a conv going up."""

    conv: object
    up: bool

    def ops(self) -> list:
        return [self.conv]


Layer = ResBlock | Transformer | Resample


@dataclass
class UNet:
    """A bound UNet: call it with the original codebase's inputs (x, timesteps, context[, y])."""

    architecture: str
    model_channels: int
    time_embed: tuple[object, object]
    label_emb: tuple[object, object] | None
    conv_in: object
    input_blocks: list[list[Layer]]
    middle: list[Layer]
    output_blocks: list[list[Layer]]
    out_norm: object
    out_conv: object
    dtype: torch.dtype = torch.float32
    in_channels: int = 4
    context_dim: int = 768
    adm_channels: int | None = None
    extra: dict = field(default_factory=dict)

    def __call__(self, x, timesteps, context, y=None) -> torch.Tensor:
        dt = self.dtype
        t = timestep_embedding(timesteps, self.model_channels).to(dt)
        emb = self.time_embed[1](F.silu(self.time_embed[0](t)))
        if self.label_emb is not None:
            if y is None:
                raise ValueError("this UNet takes an ADM vector `y`")
            emb = emb + self.label_emb[1](F.silu(self.label_emb[0](y.to(dt))))
        emb_silu = F.silu(emb)
        context = context.to(dt)
        h = self.conv_in(x.to(dt))
        skips = [h]
        for layers in self.input_blocks:
            h = _run(layers, h, emb_silu, context, None)
            skips.append(h)
        h = _run(self.middle, h, emb_silu, context, None)
        for layers in self.output_blocks:
            h = torch.cat([h, skips.pop()], dim=1)
            h = _run(layers, h, emb_silu, context, skips[-1].shape[-2:] if skips else None)
        return self.out_conv(F.silu(self.out_norm(h)))

    def op_order(self) -> list:
        """Every op in the order a forward calls it (the streamer reads ahead in this order)."""
        order = [*self.time_embed, *(self.label_emb or ()), self.conv_in]
        for layers in (*self.input_blocks, self.middle, *self.output_blocks):
            for layer in layers:
                order += layer.ops()
        return [o for o in (*order, self.out_norm, self.out_conv) if o is not None]


def _run(layers: list[Layer], h, emb_silu, context, up_size) -> torch.Tensor:
    for layer in layers:
        if isinstance(layer, ResBlock):
            h = layer(h, emb_silu)
        elif isinstance(layer, Transformer):
            h = layer(h, context)
        elif layer.up:
            # nearest ×2; to the next skip's size when it is not exactly twice (odd latent sizes, as
            # diffusers' forward_upsample_size does) — the same result whenever it is
            if up_size is not None and tuple(up_size) != (h.shape[-2] * 2, h.shape[-1] * 2):
                h = F.interpolate(h, size=tuple(up_size), mode="nearest")
            else:
                h = F.interpolate(h, scale_factor=2.0, mode="nearest")
            h = layer.conv(h)
        else:
            h = layer.conv(h)
    return h


# -- binding the file's ops -----------------------------------------------------------------------------


def _conv3(m, stride: int = 1):
    """The 3×3 convs of the UNet pad by 1 (the file holds no padding or stride)."""
    if tuple(m.kernel_size) == (3, 3):
        m.padding = (1, 1)
        m.stride = (stride, stride)
    return m


def _resblock(ops: Ops, p: str) -> ResBlock:
    return ResBlock(
        ops[f"{p}.in_layers.0"],
        _conv3(ops[f"{p}.in_layers.2"]),
        ops[f"{p}.emb_layers.1"],
        ops[f"{p}.out_layers.0"],
        _conv3(ops[f"{p}.out_layers.3"]),
        ops.get(f"{p}.skip_connection"),
    )


def _transformer(ops: Ops, p: str, architecture: str, upcast: bool) -> Transformer:
    norm = ops[f"{p}.norm"]
    norm.eps = TRANSFORMER_NORM_EPS
    proj_in = ops[f"{p}.proj_in"]
    linear = len(wshape(proj_in)) == 2  # the logical shape: a GGUF weight is held as flat bytes
    blocks = []
    for i in ops.children(f"{p}.transformer_blocks"):
        b = f"{p}.transformer_blocks.{i}"
        q1 = ops[f"{b}.attn1.to_q"]
        heads = heads_for(architecture, wshape(q1)[0])

        def attn(name: str, b=b, heads=heads) -> Attention:
            a = f"{b}.{name}"
            return Attention(
                ops[f"{a}.to_q"], ops[f"{a}.to_k"], ops[f"{a}.to_v"], ops[f"{a}.to_out.0"], heads, upcast
            )

        blocks.append(
            Block(
                ops[f"{b}.norm1"],
                attn("attn1"),
                ops[f"{b}.norm2"],
                attn("attn2"),
                ops[f"{b}.norm3"],
                ops[f"{b}.ff.net.0.proj"],
                ops[f"{b}.ff.net.2"],
            )
        )
    return Transformer(norm, proj_in, blocks, ops[f"{p}.proj_out"], linear)


def _layers(ops: Ops, p: str, architecture: str, upcast: bool) -> list[Layer]:
    out: list[Layer] = []
    for s in ops.children(p):
        q = f"{p}.{s}"
        if f"{q}.op" in ops:
            out.append(Resample(_conv3(ops[f"{q}.op"], stride=2), up=False))
        elif f"{q}.conv" in ops:
            out.append(Resample(_conv3(ops[f"{q}.conv"]), up=True))
        elif f"{q}.in_layers.0" in ops:
            out.append(_resblock(ops, q))
        elif f"{q}.proj_in" in ops:
            out.append(_transformer(ops, q, architecture, upcast))
        else:
            from ..errors import UnsupportedModel

            raise UnsupportedModel(f"{ops.what}: {q} is neither a ResBlock, a transformer nor a resampler")
    return out


def bind_unet(ops: Ops, architecture: str, dtype: torch.dtype) -> UNet:
    """The UNet over `ops` (LDM paths -> the component's castable ops)."""
    upcast = architecture == "sd2" and dtype == torch.float16
    t0, t2 = ops["time_embed.0"], ops["time_embed.2"]
    label = (ops["label_emb.0.0"], ops["label_emb.0.2"]) if "label_emb.0.0" in ops else None
    conv_in = _conv3(ops["input_blocks.0.0"])
    inputs = [
        _layers(ops, f"input_blocks.{n}", architecture, upcast) for n in ops.children("input_blocks")[1:]
    ]
    outputs = [
        _layers(ops, f"output_blocks.{n}", architecture, upcast) for n in ops.children("output_blocks")
    ]
    return UNet(
        architecture,
        wshape(t0)[1],
        (t0, t2),
        label,
        conv_in,
        inputs,
        _layers(ops, "middle_block", architecture, upcast),
        outputs,
        ops["out.0"],
        _conv3(ops["out.2"]),
        dtype=dtype,
        in_channels=wshape(conv_in)[1],
        context_dim=wshape(ops["middle_block.1.transformer_blocks.0.attn2.to_k"])[1],
        adm_channels=wshape(label[0])[1] if label else None,
    )
