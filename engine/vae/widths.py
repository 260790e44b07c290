"""A video VAE file's widths from its safetensors header (no tensor data read), for engine.vae.estimate: the
activations scale with the widths the file really has -- a pruned or reduced VAE is smaller than the
published one."""

from __future__ import annotations

_VIDEO_HEAD_KEYS = ("decoder.head.2.weight", "decoder.conv_out.weight", "decoder.conv_out.conv.weight")
_VIDEO_MID_KEYS = ("decoder.conv1.weight", "decoder.conv_in.weight", "decoder.conv_in.conv.weight")
# Mochi's: the output Linear (2-D) and the 1x1x1 input conv (the release's `blocks.0.0`; diffusers' conv_in)
_VIDEO_HEAD_KEYS += ("decoder.output_proj.weight", "decoder.proj_out.weight")
_VIDEO_MID_KEYS += ("decoder.blocks.0.0.weight",)
# Cosmos 1.0's tokenizer: the factorized output and input convs' spatial halves (diffusers' names, NVIDIA's)
_VIDEO_HEAD_KEYS += ("decoder.conv_out.conv_s.weight", "decoder.conv_out.0.conv3d.weight")
_VIDEO_MID_KEYS += ("decoder.conv_in.conv_s.weight", "decoder.conv_in.0.conv3d.weight")


def video_widths(path: str, kind: str, prefix: str = "") -> tuple[int, int] | None:
    """(ch, mid) of a Wan-family VAE file from its safetensors header (no tensor data read): the
    activations scale with the widths the file really has -- a pruned or reduced VAE is smaller than the
    published one. None where the header does not say (another format, other keys)."""
    from ..formats.safetensors import read_header
    from .estimate import VIT_KINDS

    try:
        tensors = read_header(path).tensors
    except Exception:  # noqa: BLE001 -- an unreadable header: the published widths stand
        return None

    def shape(keys, dims):
        info = next((tensors[prefix + k] for k in keys if prefix + k in tensors), None)
        return tuple(info.shape) if info is not None and len(info.shape) == dims else None

    if kind in VIT_KINDS:  # a ViT decoder: its token width, from proj_in
        info = tensors.get(prefix + "decoder.proj_in.weight")
        return (info.shape[0], info.shape[0]) if info is not None and len(info.shape) == 2 else None
    dims = 4 if kind == "qwen_image21" else 5  # its convolutions are 2-D
    head, first = shape(_VIDEO_HEAD_KEYS, 2 if kind == "mochi" else dims), shape(_VIDEO_MID_KEYS, dims)
    if head is None or first is None:
        return None
    # Wan 2.2 works on 2x2 patches, LTX-Video on 4x4, Cosmos's tokenizer on 4x4x4 (its last level at 1/4 the size)
    patch = {"wan22": 2, "ltxv": 4, "ltx2": 4, "cosmos_predict1": 4}.get(kind, 1)
    return max(1, head[1] // (patch * patch)), first[0]
