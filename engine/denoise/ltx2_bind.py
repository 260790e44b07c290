"""Binding an LTX-2 transformer's ops (engine.denoise.ltx2 holds its forward and the facts it is written from): the
release's names with its text connectors, or diffusers', onto LTX2's streams, blocks and connectors."""

from __future__ import annotations

import torch

from ..errors import UnsupportedModel
from .common import NormedAttn as Attn
from .common import Ops, held_shape, wshape
from .ltx2 import (
    CONNECTOR_HEADS,
    HEADS,
    LTX2,
    TABLES,
    AdaLN,
    Block,
    Connector,
    ConnectorBlock,
    Stream,
)
from .ltxv import (
    read_table,
    release_paths,
)

# -- binding the file's ops -----------------------------------------------------------------------------

WHAT = "an LTX-2 transformer"
_CONNECTORS = (
    ("video_connector", "video_embeddings_connector"),
    ("audio_connector", "audio_embeddings_connector"),
)


def _release_paths(mods: dict) -> dict:
    """A diffusers-named file's paths in the release's (its connectors too, should a file hold diffusers'
    LTX2TextConnectors beside the transformer: `video_connector.transformer_blocks` -> ...)."""
    out = {}
    for p, m in release_paths(mods).items():
        for d, o in _CONNECTORS:
            if p == d or p.startswith(d + "."):
                p = o + p[len(d) :].replace(".transformer_blocks.", ".transformer_1d_blocks.", 1)
        out[p] = m
    return out


def bind_ltx2(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, LTX2]:
    """(naming, the forward) of an LTX-2 transformer in the release's or diffusers' naming; `mods`: the component's
    modules by path (the plain holders of the scale-shift tables and the connectors' registers)."""
    naming = "diffusers" if "proj_in" in mods else "release"
    if naming == "diffusers":
        mods = _release_paths(mods)
        ops = ops.renamed(mods)
    blocks_at = ops.children("transformer_blocks")
    if not blocks_at or "patchify_proj" not in ops or "audio_patchify_proj" not in ops:
        raise UnsupportedModel(f"{ops.what}: no video and audio streams of blocks — not {WHAT}")

    def attn(p: str) -> Attn:
        names = ("to_q", "to_k", "to_v", "to_out.0", "q_norm", "k_norm")
        return Attn(*(ops[f"{p}.{n}"] for n in names), gate=ops.get(f"{p}.to_gate_logits"))

    def heads(a: Attn, default: int) -> int:
        return wshape(a.gate)[0] if a.gate is not None else default

    first = f"transformer_blocks.{blocks_at[0]}"
    vd, ad = wshape(ops["patchify_proj"])[0], wshape(ops["audio_patchify_proj"])[0]
    vh, ah = heads(attn(f"{first}.attn1"), HEADS), heads(attn(f"{first}.audio_attn1"), HEADS)
    cross = wshape(ops[f"{first}.audio_to_video_attn.to_q"])[0]
    for width, n, what in (
        (vd, vh, "video"),
        (ad, ah, "audio"),
        (cross, vh, "cross-modal"),
        (cross, ah, "cross-modal"),
    ):
        if width % (2 * n):
            raise UnsupportedModel(
                f"{ops.what}: {what} width {width} does not split over {n} heads' RoPE — not {WHAT}"
            )
    ca_names = TABLES[naming]
    blocks = []
    for i in blocks_at:
        p = f"transformer_blocks.{i}"
        tables = read_table(ops, mods, p, "scale_shift_table", (6, 9), vd, WHAT)
        for attr, rows, width in (
            ("audio_scale_shift_table", (6, 9), ad),
            (ca_names[0], (5,), vd),
            (ca_names[1], (5,), ad),
        ):
            read_table(ops, mods, p, attr, rows, width, WHAT)
        q_mod = 9 in (
            held_shape(tables, "scale_shift_table")[0],
            held_shape(tables, "audio_scale_shift_table")[0],
        )
        for attr, width in (("prompt_scale_shift_table", vd), ("audio_prompt_scale_shift_table", ad)):
            if q_mod:  # LTX-2.3's cross-attention AdaLN: the context's tables come with it
                read_table(ops, mods, p, attr, (2,), width, WHAT)
            elif getattr(tables, attr, None) is not None:
                raise UnsupportedModel(
                    f"{ops.what}: {p}.{attr} without the 9-row tables it goes with — not {WHAT}"
                )
        blocks.append(Block(tables, ca_names, attn(f"{p}.attn1"), attn(f"{p}.audio_attn1"), attn(f"{p}.attn2"),
                            attn(f"{p}.audio_attn2"), attn(f"{p}.audio_to_video_attn"), attn(f"{p}.video_to_audio_attn"),
                            (ops[f"{p}.ff.net.0.proj"], ops[f"{p}.ff.net.2"]),
                            (ops[f"{p}.audio_ff.net.0.proj"], ops[f"{p}.audio_ff.net.2"])))  # fmt: skip
    prompted = getattr(blocks[0].tables, "prompt_scale_shift_table", None) is not None
    if any((getattr(b.tables, "prompt_scale_shift_table", None) is not None) != prompted for b in blocks):
        raise UnsupportedModel(f"{ops.what}: some blocks have the prompt tables and some not — not {WHAT}")

    def adaln(p: str) -> AdaLN:
        te = f"{p}.emb.timestep_embedder"
        return AdaLN((ops[f"{te}.linear_1"], ops[f"{te}.linear_2"]), ops[f"{p}.linear"])

    def prompt(p: str) -> AdaLN | None:
        if not ops.has_prefix(p):
            return None
        if not prompted:
            raise UnsupportedModel(f"{ops.what}: a {p} but no prompt tables in the blocks — not {WHAT}")
        return adaln(p)

    def pair(p: str) -> tuple[object, object] | None:
        return (ops[f"{p}.linear_1"], ops[f"{p}.linear_2"]) if ops.has_prefix(p) else None

    streams = [Stream(ops[f"{pre}patchify_proj"], adaln(f"{pre}adaln_single"), prompt(f"{pre}prompt_adaln_single"),
                      adaln(f"av_ca_{side}_scale_shift_adaln_single"), adaln(f"av_ca_{gate}_gate_adaln_single"),
                      pair(f"{pre}caption_projection"), _connector(ops, mods, f"{side}_embeddings_connector"),
                      ops[f"{pre}proj_out"], n)
               for pre, side, gate, n in (("", "video", "a2v", vh), ("audio_", "audio", "v2a", ah))]  # fmt: skip
    root = read_table(ops, mods, "", "scale_shift_table", (2,), vd, WHAT)
    read_table(ops, mods, "", "audio_scale_shift_table", (2,), ad, WHAT)
    keyframes = getattr(root, "keyframes_abs_pos_embedding", None) is not None
    if keyframes:
        read_table(ops, mods, "", "keyframes_abs_pos_embedding", (1,), vd, WHAT)
    model = LTX2(architecture, *streams, blocks, root, keyframes, prompted, dtype)
    return naming, model


def _connector(ops: Ops, mods: dict, p: str) -> Connector | None:
    """The text connector at `p`, where the file holds one (a release's file does, beside the transformer)."""
    if not ops.has_prefix(p):
        return None
    holder = mods.get(p)
    if holder is None or getattr(holder, "learnable_registers", None) is None:
        raise UnsupportedModel(f"{ops.what}: a text connector {p} without learnable registers — not {WHAT}")
    ops.take(holder)
    blocks = []
    for i in ops.children(f"{p}.transformer_1d_blocks"):
        b = f"{p}.transformer_1d_blocks.{i}"
        a = b + ".attn1"
        names = ("to_q", "to_k", "to_v", "to_out.0", "q_norm", "k_norm")
        attn = Attn(*(ops[f"{a}.{n}"] for n in names), gate=ops.get(f"{a}.to_gate_logits"))
        blocks.append(ConnectorBlock(attn, (ops[f"{b}.ff.net.0.proj"], ops[f"{b}.ff.net.2"])))
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: a text connector {p} without blocks — not {WHAT}")
    width = wshape(blocks[0].attn.q)[1]
    heads = wshape(blocks[0].attn.gate)[0] if blocks[0].attn.gate is not None else CONNECTOR_HEADS
    if width % (2 * heads) or held_shape(holder, "learnable_registers")[1:] != (width,):
        raise UnsupportedModel(
            f"{ops.what}: {p} is {width} wide: not {heads} heads' or its registers' — not {WHAT}"
        )
    return Connector(holder, blocks, heads)
