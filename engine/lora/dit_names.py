"""diffusers transformer paths -> BFL (Flux) / SAI (SD3 MMDiT) module paths, with fused-weight views.

Facts from diffusers `scripts/convert_flux_to_diffusers.py`, `scripts/convert_sd3_to_diffusers.py` and
`loaders/single_file_utils.py` (cited; no code copied):

* Flux double block i = `transformer_blocks.i`: `attn.to_q/to_k/to_v` are the three row blocks of
  `img_attn.qkv`, `attn.add_q_proj/add_k_proj/add_v_proj` those of `txt_attn.qkv`; `attn.to_out.0` is
  `img_attn.proj`, `attn.to_add_out` `txt_attn.proj`; `ff.net.0.proj` / `ff.net.2` are `img_mlp.0/2`,
  `ff_context.*` `txt_mlp.*`; `norm1.linear` / `norm1_context.linear` are `img_mod.lin` / `txt_mod.lin`;
  `attn.norm_q/norm_k` (and `norm_added_*`) are `img_attn.norm.query_norm/key_norm` (`txt_…`).
* Flux single block i = `single_transformer_blocks.i`: `attn.to_q/to_k/to_v` and `proj_mlp` are the row
  blocks [0,h), [h,2h), [2h,3h), [3h, end) of `linear1`; `proj_out` is `linear2`; `norm.linear` is
  `modulation.lin`.
* SD3 joint block i = `transformer_blocks.i`: the same attention split over `x_block.attn.qkv` and
  `context_block.attn.qkv`, `attn2.*` over `x_block.attn2.*` (SD3.5 medium), `ff(_context).net.0.proj/2`
  over `x_block/context_block.mlp.fc1/fc2`, `norm1(_context).linear` over `adaLN_modulation.1`.
* Final layers: `norm_out.linear` is `final_layer.adaLN_modulation.1` with its two halves (shift, scale)
  in the opposite order (diffusers' `swap_scale_shift`), as is the last SD3 context block's modulation.
"""

from __future__ import annotations

from collections.abc import Mapping

# A view of a base weight: None (the whole weight), ("rows", start, length), ("swap",) (the two
# halves of the rows exchanged) or ("transpose",).
View = tuple | None

_FLUX_TOP = {
    "x_embedder": "img_in",
    "context_embedder": "txt_in",
    "time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
    "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
    "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
    "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
    "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
    "proj_out": "final_layer.linear",
}
_SD3_TOP = {
    "pos_embed.proj": "x_embedder.proj",
    "context_embedder": "context_embedder",
    "time_text_embed.timestep_embedder.linear_1": "t_embedder.mlp.0",
    "time_text_embed.timestep_embedder.linear_2": "t_embedder.mlp.2",
    "time_text_embed.text_embedder.linear_1": "y_embedder.mlp.0",
    "time_text_embed.text_embedder.linear_2": "y_embedder.mlp.2",
    "proj_out": "final_layer.linear",
}
_FLUX_DOUBLE = {
    "attn.to_out.0": "img_attn.proj",
    "attn.to_add_out": "txt_attn.proj",
    "ff.net.0.proj": "img_mlp.0",
    "ff.net.2": "img_mlp.2",
    "ff_context.net.0.proj": "txt_mlp.0",
    "ff_context.net.2": "txt_mlp.2",
    "norm1.linear": "img_mod.lin",
    "norm1_context.linear": "txt_mod.lin",
    "attn.norm_q": "img_attn.norm.query_norm",
    "attn.norm_k": "img_attn.norm.key_norm",
    "attn.norm_added_q": "txt_attn.norm.query_norm",
    "attn.norm_added_k": "txt_attn.norm.key_norm",
}
_SD3_JOINT = {
    "attn.to_out.0": "x_block.attn.proj",
    "attn.to_add_out": "context_block.attn.proj",
    "attn2.to_out.0": "x_block.attn2.proj",
    "ff.net.0.proj": "x_block.mlp.fc1",
    "ff.net.2": "x_block.mlp.fc2",
    "ff_context.net.0.proj": "context_block.mlp.fc1",
    "ff_context.net.2": "context_block.mlp.fc2",
    "norm1.linear": "x_block.adaLN_modulation.1",
    "attn.norm_q": "x_block.attn.ln_q",
    "attn.norm_k": "x_block.attn.ln_k",
    "attn.norm_added_q": "context_block.attn.ln_q",
    "attn.norm_added_k": "context_block.attn.ln_k",
    "attn2.norm_q": "x_block.attn2.ln_q",
    "attn2.norm_k": "x_block.attn2.ln_k",
}


def _qkv(out: dict, prefix: str, names: tuple[str, str, str], base: str, rows: int | None) -> None:
    if not rows or rows % 3:
        return
    h = rows // 3
    for i, n in enumerate(names):
        out[f"{prefix}.{n}"] = (base, ("rows", i * h, h))


def diffusers_to_dit(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[str, View]]:
    """diffusers path -> (base module path, view) for a Flux or SD3 layout (module path -> weight shape)."""
    out: dict[str, tuple[str, View]] = {}
    flux = any(p.startswith("double_blocks.") for p in shapes)
    top = _FLUX_TOP if flux else _SD3_TOP
    for d, b in top.items():
        if b in shapes:
            out[d] = (b, None)
    if "final_layer.adaLN_modulation.1" in shapes:
        out["norm_out.linear"] = ("final_layer.adaLN_modulation.1", ("swap",))
    if flux:
        doubles = {int(p.split(".")[1]) for p in shapes if p.startswith("double_blocks.")}
        for i in sorted(doubles):
            b = f"double_blocks.{i}"
            for d, bb in _FLUX_DOUBLE.items():
                if f"{b}.{bb}" in shapes:
                    out[f"transformer_blocks.{i}.{d}"] = (f"{b}.{bb}", None)
            _qkv(
                out,
                f"transformer_blocks.{i}.attn",
                ("to_q", "to_k", "to_v"),
                f"{b}.img_attn.qkv",
                shapes.get(f"{b}.img_attn.qkv", (0,))[0],
            )
            _qkv(
                out,
                f"transformer_blocks.{i}.attn",
                ("add_q_proj", "add_k_proj", "add_v_proj"),
                f"{b}.txt_attn.qkv",
                shapes.get(f"{b}.txt_attn.qkv", (0,))[0],
            )
        singles = {int(p.split(".")[1]) for p in shapes if p.startswith("single_blocks.")}
        for i in sorted(singles):
            b = f"single_blocks.{i}"
            d = f"single_transformer_blocks.{i}"
            lin1 = shapes.get(f"{b}.linear1")
            hidden = shapes.get(f"{b}.linear2", (0,))[0]
            if lin1 and hidden:
                for j, n in enumerate(("attn.to_q", "attn.to_k", "attn.to_v")):
                    out[f"{d}.{n}"] = (f"{b}.linear1", ("rows", j * hidden, hidden))
                out[f"{d}.proj_mlp"] = (f"{b}.linear1", ("rows", 3 * hidden, lin1[0] - 3 * hidden))
            for dn, bn in (
                ("proj_out", "linear2"),
                ("norm.linear", "modulation.lin"),
                ("attn.norm_q", "norm.query_norm"),
                ("attn.norm_k", "norm.key_norm"),
            ):
                if f"{b}.{bn}" in shapes:
                    out[f"{d}.{dn}"] = (f"{b}.{bn}", None)
        return out
    joints = sorted({int(p.split(".")[1]) for p in shapes if p.startswith("joint_blocks.")})
    for i in joints:
        b = f"joint_blocks.{i}"
        d = f"transformer_blocks.{i}"
        for dn, bn in _SD3_JOINT.items():
            if f"{b}.{bn}" in shapes:
                out[f"{d}.{dn}"] = (f"{b}.{bn}", None)
        ctx_mod = f"{b}.context_block.adaLN_modulation.1"
        if ctx_mod in shapes:
            # The last context block is "pre-only": diffusers keeps its (shift, scale) swapped.
            out[f"{d}.norm1_context.linear"] = (ctx_mod, ("swap",) if i == joints[-1] else None)
        for blk, names in (
            ("x_block.attn.qkv", ("attn.to_q", "attn.to_k", "attn.to_v")),
            ("context_block.attn.qkv", ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")),
            ("x_block.attn2.qkv", ("attn2.to_q", "attn2.to_k", "attn2.to_v")),
        ):
            _qkv(out, d, names, f"{b}.{blk}", shapes.get(f"{b}.{blk}", (0,))[0])
    return out
