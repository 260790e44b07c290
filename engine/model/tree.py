"""Infer a torch module tree from a checkpoint's tensor names and shapes, out of castable ops.

The file says nothing about module types, so each module is decided from its own tensors — the rule:

* ``x.weight`` with 2 dims → ``Linear(in, out)``, unless the last name segment contains ``embedding``
  (``token_embedding``, ``position_embedding``, ``embed_tokens``) → ``Embedding(num, dim)``;
* ``x.weight`` with 3 / 4 / 5 dims → ``Conv1d`` / ``Conv2d`` / ``Conv3d`` (kernel size from the shape,
  groups = 1; stride and padding are architecture facts the file does not hold: they default to 1 / 0
  and an architecture that runs the module, such as the VAE, sets them);
* ``x.weight`` with 1 dim and a matching 1-dim ``x.bias`` → a norm: ``LayerNorm`` when the name says so
  (a segment containing ``layer_norm`` / ``layernorm``, starting with ``ln``, or the module sits in a
  transformer block: a path segment equal to ``transformer_blocks``, ``layers``, ``resblocks`` or
  ``blocks``), else
  ``GroupNorm`` with 32 groups — the SD family's fixed group count (ldm's ``Normalize``), or 1 group
  when the channels do not divide by 32;
* ``x.weight`` with 1 dim and no bias under a norm-like name (``norm`` in a segment, or Cosmos 1.0's
  ``to_q.1`` / ``to_k.1``) → ``RMSNorm``; so is
  a lone 1-dim ``x.scale`` under such a name (FLUX.1's QK-norm in BFL naming, ``query_norm.scale``);
* anything else (buffers such as ``position_ids``, stray scalars, ``x.scale``) → plain parameters (float
  tensors) or buffers (integer tensors) on a plain ``nn.Module``, kept exactly as named;
* but ``x.gate_up_proj`` and ``x.down_proj``, 3-D each → a mixture of experts' packed weights
  (``engine.model.experts.PackedExperts``, a castable op, so they tier and stream as layers do).

Every module is created on the meta device (no memory); the caller binds the real tensors, so the
tree's ``state_dict`` keys are exactly the file's keys below the component prefix. A tensor of a ggml
block type (GGUF: Q8_0, Q4_K, …) is typed by its logical shape like any other; its op records how to
dequantize it (``Castable.quantized``) and will hold the raw blocks; so does a plain holder's (read
through ``engine.denoise.common.held``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import UnsupportedModel
from ..formats.safetensors import TensorInfo

_LAYER_NORM_SEGMENT = re.compile(r"(layer_?norm|layernorm|^ln(_|\d|$)|^ln_final$)")
_TRANSFORMER_CONTEXT = frozenset({"transformer_blocks", "layers", "resblocks", "blocks"})
GROUPS = 32


@dataclass(frozen=True)
class ModuleSpec:
    """What one module of the tree is: its path, the op kind and the tensors it holds (attr -> info)."""

    path: str
    kind: str  # linear | embedding | conv1d | conv2d | conv3d | layernorm | groupnorm | rmsnorm | experts | plain
    tensors: dict[str, TensorInfo]


def _is_layer_norm(path: str) -> bool:
    last = path.rsplit(".", 1)[-1]
    if _LAYER_NORM_SEGMENT.search(last):
        return True
    return "norm" in last and not _TRANSFORMER_CONTEXT.isdisjoint(path.split("."))


def classify(path: str, tensors: dict[str, TensorInfo]) -> str:
    """The op kind for one module from its own tensors (see the module docstring for the rule)."""
    w = tensors.get("weight")
    b = tensors.get("bias")
    s = tensors.get("scale")
    if is_packed_experts(tensors):
        return "experts"
    if set(tensors) == {"scale"} and len(s.shape) == 1 and s.dtype.startswith(("F", "BF")):
        return "rmsnorm" if _norm_named(path) else "plain"
    if w is None or set(tensors) - {"weight", "bias"} or w.dtype in ("I64", "I32", "I8", "U8", "BOOL"):
        return "plain"
    last = path.rsplit(".", 1)[-1]
    nd = len(w.shape)
    if (
        nd == 2
        and b is None
        and ("embedding" in last or last in ("embed_tokens", "shared", "relative_attention_bias"))
    ):
        return "embedding"
    if b is not None and b.shape != w.shape[:1]:
        return "plain"
    if nd == 2:
        return "linear"
    if nd in (3, 4, 5):
        return f"conv{nd - 2}d"
    if nd == 1:
        if b is not None:
            return "layernorm" if _is_layer_norm(path) else "groupnorm"
        if _norm_named(path):
            return "rmsnorm"
    return "plain"


def is_packed_experts(tensors: dict[str, TensorInfo]) -> bool:
    """A module's tensors are a mixture of experts' packed pair: `gate_up_proj` [E, D, 2I], `down_proj` [E, I, D]."""
    if set(tensors) != {"gate_up_proj", "down_proj"}:
        return False
    gu, dn = tensors["gate_up_proj"].shape, tensors["down_proj"].shape
    return len(gu) == 3 and len(dn) == 3 and gu[0] == dn[0] and gu[2] == 2 * dn[1] and gu[1] == dn[2]


def _norm_named(path: str) -> bool:
    """A norm by its name: `…query_norm`, `…norm1`, `…ln_q`, or an item of a list of norms (Chroma's
    `distilled_guidance_layer.norms.3`)."""
    parts = path.split(".")
    if parts[-2:] in (["to_q", "1"], ["to_k", "1"]):
        return True  # Cosmos 1.0's per-head QK norms, each the second item of a (Linear, RMSNorm) Sequential
    last = parts[-2] if parts[-1].isdigit() and len(parts) > 1 else parts[-1]
    return "norm" in last or last.startswith("ln_")  # SD3.5's per-head `ln_q` / `ln_k`


def module_specs(tensors: Iterable[tuple[str, TensorInfo]]) -> list[ModuleSpec]:
    """Group (relative name, info) pairs by module path and classify each module, in file order."""
    groups: dict[str, dict[str, TensorInfo]] = {}
    for name, info in tensors:
        path, _, attr = name.rpartition(".")
        groups.setdefault(path, {})[attr] = info
    from ..quant.scaled import COMPANIONS

    out = []
    for path, ts in groups.items():
        # A scaled weight's companions (scale_weight, weight_scale, comfy_quant, …) ride along with
        # the module: it is typed by its own weight and bias.
        core = ts
        if COMPANIONS & ts.keys():
            core = {a: i for a, i in ts.items() if a not in COMPANIONS}
            w = core.get("weight")
            if w is not None and w.dtype == "I8":  # an int8 weight with its scale is a float weight
                core["weight"] = w._replace(dtype="F8_E4M3")
        out.append(ModuleSpec(path, classify(path, core) if core else "plain", ts))
    return out


def make_op(spec: ModuleSpec):
    """An empty module (meta tensors) of the spec's kind, with the right shapes."""
    import types

    quantized = _quant_specs(spec)
    w = spec.tensors.get("weight")
    if quantized and spec.kind == "plain" and w is not None and len(w.shape) >= 2:
        # a layer's tensors whose shapes fit no layer (an edited orig_shape): say what they are
        q = next(iter(quantized.values()))
        kind = getattr(q, "ggml_type", None) or q.fmt
        held = ", ".join(f"{a} {list(i.shape)}" for a, i in spec.tensors.items())
        raise UnsupportedModel(
            f"{spec.path}: a {kind} layer whose tensors ({held}) fit no linear, convolution, embedding "
            "or norm layer, where Loadout cannot dequantize it (a damaged or edited file?)"
        )
    # A plain holder's quantized tensors (stable-diffusion.cpp's converter quantizes every tensor whose
    # rows fill whole blocks but biases: Z-Image's pad tokens and caption norm, Wan's modulations) keep
    # their blocks like a layer's; the forward reads them dequantized (engine.denoise.common.held).
    op = _make_op(spec)
    if quantized:
        op.quantized = types.MappingProxyType(quantized)
    return op


def _quant_specs(spec: ModuleSpec) -> dict:
    """attr -> QuantSpec for the spec's tensors of ggml block types; UnsupportedModel naming the
    tensor for a dtype no loader here knows (a ggml type Loadout cannot dequantize)."""
    DTYPES, QuantSpec, check_supported, is_block_type, spec_for = _quant_api()
    out = {}
    w = spec.tensors.get("weight")
    scaled = spec_for(spec.tensors, f"{w.name}: " if w is not None else "")
    if scaled is not None:
        out["weight"] = scaled
    for attr, info in spec.tensors.items():
        if info.dtype in DTYPES:
            continue
        try:
            check_supported(info.dtype)
        except UnsupportedModel as e:
            raise UnsupportedModel(f"{info.name}: {e.message}") from None
        if is_block_type(info.dtype):
            out[attr] = QuantSpec(info.dtype, info.shape)
    return out


@functools.cache
def _quant_api():
    """What _quant_specs uses, imported once (they import torch: not at this module's import)."""
    from ..formats.dtypes import DTYPES
    from ..quant import QuantSpec, check_supported, is_block_type
    from ..quant.scaled import spec_for

    return DTYPES, QuantSpec, check_supported, is_block_type, spec_for


# One meta-device module per (class, constructor arguments), copied for every op of that shape: a
# component has thousands of ops of a few dozen shapes, and nn.Module's constructor with its checked
# __setattr__ was half of building a component's disk tier (SD1.5: 3,075 ops, 20 of 42 ms).
_TEMPLATES: dict[tuple, tuple[dict, list[str]]] = {}


def _new(cls, *args, **kw):
    """cls(*args, device="meta", **kw), built once and copied: the instance dict shallow-copied with
    its containers (parameters, buffers, hooks, submodules, patch lists) copied, so nothing mutable is
    shared; the meta parameters themselves are shared until the component binds the file's tensors
    in their place (binding replaces the entries of `_parameters`, never the tensors)."""
    key = (cls, args, tuple(kw.items()))
    got = _TEMPLATES.get(key)
    if got is None:
        if len(_TEMPLATES) > 4096:
            _TEMPLATES.clear()
        d = cls(*args, device="meta", **kw).__dict__
        got = _TEMPLATES[key] = (d, [k for k, v in d.items() if isinstance(v, (dict, set, list))])
    d, containers = got
    m = cls.__new__(cls)
    md = m.__dict__
    md.update(d)
    for k in containers:
        md[k] = d[k].copy()
    return m


def _make_op(spec: ModuleSpec):
    import torch
    from torch import nn

    from .. import ops

    w = spec.tensors.get("weight")
    has_bias = "bias" in spec.tensors
    if spec.kind == "linear":
        return _new(ops.Linear, w.shape[1], w.shape[0], bias=has_bias)
    if spec.kind == "embedding":
        return _new(ops.Embedding, w.shape[0], w.shape[1])
    if spec.kind.startswith("conv"):
        cls = {"conv1d": ops.Conv1d, "conv2d": ops.Conv2d, "conv3d": ops.Conv3d}[spec.kind]
        return _new(cls, w.shape[1], w.shape[0], tuple(w.shape[2:]), bias=has_bias)
    if spec.kind == "layernorm":
        return _new(ops.LayerNorm, w.shape[0])
    if spec.kind == "groupnorm":
        c = w.shape[0]
        return _new(ops.GroupNorm, GROUPS if c % GROUPS == 0 else 1, c)
    if spec.kind == "experts":
        from .experts import PackedExperts

        e, d, i2 = spec.tensors["gate_up_proj"].shape
        return _new(PackedExperts, e, d, i2 // 2)
    if spec.kind == "rmsnorm":
        if w is None:
            return _new(ops.ScaleRMSNorm, spec.tensors["scale"].shape[0])
        return _new(ops.RMSNorm, w.shape[0])
    m = nn.Module()
    for attr, info in spec.tensors.items():
        from ..formats.dtypes import torch_dtype

        *_, is_block_type, _ = _quant_api()
        if is_block_type(info.dtype):  # ggml blocks: held as their flat bytes, like a layer's
            m.register_buffer(attr, torch.empty(info.nbytes, dtype=torch.uint8, device="meta"))
            continue
        t = torch.empty(info.shape, dtype=torch_dtype(info.dtype), device="meta")
        if t.is_floating_point():
            m.register_parameter(attr, nn.Parameter(t, requires_grad=False))
        else:
            m.register_buffer(attr, t)
    return m


def build_tree(specs: list[ModuleSpec]):
    """Assemble the specs into one nn.Module tree (meta tensors); returns (root, {path: module})."""
    from torch import nn

    root = nn.Module()
    made: dict[str, nn.Module] = {"": root}

    def container(path: str) -> nn.Module:
        if path in made:
            return made[path]
        parent_path, _, leaf = path.rpartition(".")
        parent = container(parent_path)
        m = nn.Module()
        parent.add_module(leaf, m)
        made[path] = m
        return m

    by_path: dict[str, nn.Module] = {}
    # Deeper paths after shallower ones: a module that is both a leaf op and a parent keeps its children.
    for spec in sorted(specs, key=lambda s: s.path.count(".") if s.path else -1):
        op = make_op(spec)
        if spec.path == "":
            for attr, t in (*op.named_parameters(recurse=False), *op.named_buffers(recurse=False)):
                if isinstance(t, nn.Parameter):
                    root.register_parameter(attr, t)
                else:
                    root.register_buffer(attr, t)
            if "quantized" in op.__dict__:
                root.quantized = op.quantized
            by_path[""] = root
            continue
        parent_path, _, leaf = spec.path.rpartition(".")
        existing = made.get(spec.path)
        parent = container(parent_path)
        if existing is not None:  # a plain container made earlier for children: move them onto the op
            for child_name, child in existing.named_children():
                op.add_module(child_name, child)
        parent.add_module(leaf, op)
        made[spec.path] = op
        by_path[spec.path] = op
    return root, by_path
