"""Z-Image Omni (Tongyi-MAI Z-Image-Omni-Base, the model Z-Image's editing builds on): Z-Image's transformer
(engine.denoise.nextdit) with a SigLIP2 embedder (`siglip_embedder.0/1`: RMSNorm, Linear), its refiner
(`siglip_refiner.N`, unmodulated blocks) and `siglip_pad_token`, run over one sequence of every caption
piece, every image and every image's SigLIP grid.

Facts (from diffusers' `ZImageTransformer2DModel` omni path and its `ZImageOmniPipeline`, and DiffSynth-
Studio's `z_image_dit.py`, which compute the same; read for the facts, nothing copied):

* the images are N condition latents (clean) and the target (noisy); the prompt is cut into caption pieces
  around each image's vision tokens (N + 2 pieces with N conditions, one without); image j's SigLIP2
  grid [H, W, C] sits beside it (none for the target: 32 pad rows).
* two time embeddings, t and t = 1 (clean): every token of the joint sequence is modulated by its own
  side's — condition images, their grids and their caption pieces clean, the rest noisy.
* sequence: [caption pieces, images, grids], each piece padded to a multiple of 32 rows with its learned
  pad token. Positions (frame, row, column): caption piece j from c_j on axis 0 (c_0 = 1, each piece
  followed by two free frames, for its image and grid); image j at frame e_j = c_j + l_j, grid j at
  e_j + 1 with its rows and columns scaled onto the latent's (r / (H - 1) · (h - 1), truncated); pad rows
  at (0, 0, 0). Two quirks of the release are kept, as the trained weights saw them: a caption piece's
  position rows run over its padded length and are then followed by its pad rows' zeros, so a later
  piece reads positions shifted by the earlier pieces' padding; and a grid [H, W, C] is flattened as
  `permute(2, 0, 1).reshape(H·W, C)` (rows of its channel-major memory, not its pixels).
* order: the images through the noise refiner, the captions through the context refiner, the grids
  through the SigLIP refiner, then the joint sequence through the layers; the output is the target's rows.

A batch shares one structure (every item the same pieces' lengths and image sizes), as a tensor file can
hold it: `cap_lens` [B, K] the pieces' token counts in `cap_feats`, `cond_latents` [B, N, 16, h', w'],
`siglip_feats` [B, N, H, W, C].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import FormatError
from .common import held, layer_norm, mlp2, timestep_embedding, wshape
from .flux import rope_table
from .nextdit import PATCH, SEQ_MULTIPLE, NextDiT, _padded

SIGLIP_GRID = 16  # the Siglip2 processor's default max_num_patches 256 at patch 16: a square image's grid (random inputs)
PIECES = (
    4,
    2,
)  # "<|im_start|>user\n<|vision_start|>" and "<|vision_end|><|im_end|>": the first and last pieces' tokens


def _patches(x: torch.Tensor) -> torch.Tensor:
    b, c, height, width = x.shape
    h, w = height // PATCH, width // PATCH
    return x.reshape(b, c, h, PATCH, w, PATCH).permute(0, 2, 4, 3, 5, 1).reshape(b, h * w, -1)


def _grid_rows(start: float, h: int, w: int) -> torch.Tensor:
    """[h·w, 3] positions (start, r, c), row-major."""
    ids = torch.zeros(h, w, 3)
    ids[..., 0] = start
    ids[..., 1] = torch.arange(h, dtype=torch.float32)[:, None]
    ids[..., 2] = torch.arange(w, dtype=torch.float32)[None, :]
    return ids.reshape(h * w, 3)


def _pad_rows(n: int) -> torch.Tensor:
    return torch.zeros(_padded(n) - n, 3)


def _check(x, cap_feats, cap_lens, cond_latents, siglip_feats) -> tuple[list[int], int]:
    """(the caption pieces' lengths, the number of condition images), or a FormatError saying what is off."""
    n = 0 if cond_latents is None else cond_latents.shape[1]
    for name, im in (("x", x), ("cond_latents", cond_latents)):
        if im is not None and any(s % 2 for s in im.shape[-2:]):
            raise FormatError(f"input {name} has shape {list(im.shape)}: its height and width must be even")
    if siglip_feats is not None and (cond_latents is None or siglip_feats.shape[1] != n):
        raise FormatError(
            f"siglip_feats holds {siglip_feats.shape[1]} grids for {n} condition images (cond_latents)"
        )
    if cap_lens is None:
        if n:
            raise FormatError(
                f"{n} condition image(s) need cap_lens: the prompt's {n + 2} pieces around them"
            )
        return [cap_feats.shape[1]], 0
    rows = cap_lens.round().long()
    if not bool((rows == rows[0]).all()):
        raise FormatError("cap_lens differs between the batch's items: a batch shares one structure")
    lens = [int(v) for v in rows[0]]
    if sum(lens) != cap_feats.shape[1] or min(lens) < 1:
        raise FormatError(
            f"cap_lens {lens} must be positive and add up to cap_feats' {cap_feats.shape[1]} tokens"
        )
    if len(lens) < n + 1:
        raise FormatError(f"{len(lens)} caption piece(s) for {n + 1} images: each image follows its piece")
    return lens, n


def check_omni(got: dict, source: str) -> None:
    """_check on a file's inputs, its errors naming the file."""
    try:
        _check(
            got["x"], got["cap_feats"], got.get("cap_lens"), got.get("cond_latents"), got.get("siglip_feats")
        )
    except FormatError as e:
        raise FormatError(f"{source}: {e}") from None


def omni_forward(m: NextDiT, x, t, cap_feats, cap_lens=None, cond_latents=None, siglip_feats=None):
    """The Omni forward of `m` (see the module's text): x [B, 16, h, w] the target, t [B] in 0–1 (1 =
    clean), cap_feats [B, T, D]; returns the target's prediction [B, 16, h, w]."""
    lens, n = _check(x, cap_feats, cap_lens, cond_latents, siglip_feats)
    dt, f, dev, b = m.dtype, m.spec, x.device, x.shape[0]
    # the noisy then the clean time rows, one pass: [2B, 256]
    both = torch.cat([t.float(), torch.ones_like(t, dtype=torch.float32)])
    tmod = mlp2(m.time, timestep_embedding(f.time_scale * both, 256).to(dt))
    images = [cond_latents[:, j] for j in range(n)] + [x]
    noisy = [False] * n + [True]  # each image's side

    # positions and runs: caption piece j starts at frame c_j; its image at e_j, its grid at e_j + 1
    starts, ends, c = [], [], 1
    for ln in lens:
        starts.append(c)
        ends.append(c + ln)
        c += ln + 2
    cpos = torch.cat([_caption_rows(s, ln) for s, ln in zip(starts, lens, strict=True)])[
        : sum(map(_padded, lens))
    ]
    sizes = [(im.shape[-2] // PATCH, im.shape[-1] // PATCH) for im in images]
    ipos = torch.cat(
        [torch.cat([_grid_rows(ends[j], h, w), _pad_rows(h * w)]) for j, (h, w) in enumerate(sizes)]
    )
    # each piece's and image's rows, and whether they are noisy (a piece past the images is)
    cap_runs = _runs(
        [_padded(ln) for ln in lens], [noisy[j] if j < len(images) else True for j in range(len(lens))]
    )
    img_runs = _runs([_padded(h * w) for h, w in sizes], noisy)

    # the images: one embedding pass, each image's pad rows its learned token, then the noise refiner
    embedded = m.x_embedder(torch.cat([_patches(im.to(dt)) for im in images], 1))
    img, at = [], 0
    for h, w in sizes:
        img.append(m._pad(embedded[:, at : at + h * w], "x_pad_token", _padded(h * w)))
        at += h * w
    img, pe_img = torch.cat(img, 1), rope_table(ipos.to(dev)[None], f.axes, f.theta)
    for blk in m.noise_refiner:
        img = m._block(blk, img, pe_img, tmod, runs=img_runs)

    # the caption pieces: one embedding pass, each piece padded, then the context refiner
    embedded, cap, at = m._caption(cap_feats), [], 0
    for ln in lens:
        cap.append(m._pad(embedded[:, at : at + ln], "cap_pad_token", _padded(ln)))
        at += ln
    cap, pe_cap = torch.cat(cap, 1), rope_table(cpos.to(dev)[None], f.axes, f.theta)
    for blk in m.context_refiner:
        cap = m._block(blk, cap, pe_cap, None)

    seq, pe, runs, shift = [cap, img], [pe_cap, pe_img], cap_runs, cap.shape[1]
    runs = runs + [(s + shift, e + shift, v) for s, e, v in img_runs]
    if siglip_feats is not None:
        sig, pe_sig, sig_runs = _grids(m, siglip_feats, images, ends, noisy, dev)
        shift += img.shape[1]
        seq, pe = seq + [sig], pe + [pe_sig]
        runs = runs + [(s + shift, e + shift, v) for s, e, v in sig_runs]
    seq, pe = torch.cat(seq, 1), torch.cat(pe, 2)
    for blk in m.layers:
        seq = m._block(blk, seq, pe, tmod, runs=runs)

    # the target's rows (the last image's, before its pad rows), scaled by the noisy side's final factor
    h, w = sizes[-1]
    first = cap.shape[1] + img_runs[-1][0]
    rows = seq[:, first : first + h * w]
    scale = 1 + m.final_mod(F.silu(tmod[:b]))[:, None]
    out = m.final_linear(layer_norm(rows) * scale)
    return out.reshape(b, h, w, PATCH, PATCH, -1).permute(0, 5, 1, 3, 2, 4).reshape(b, -1, 2 * h, 2 * w)


def _runs(lengths: list[int], sides: list[bool]) -> list[tuple[int, int, bool]]:
    """[(start, end, noisy)] of consecutive blocks of rows."""
    out, at = [], 0
    for n, side in zip(lengths, sides, strict=True):
        out.append((at, at + n, side))
        at += n
    return out


def _caption_rows(start: int, ln: int) -> torch.Tensor:
    """A caption piece's position rows as the release makes them: frames start … start + padded − 1 (its
    padded length), then (0, 0, 0) for each pad row — longer than the piece; the caller keeps the first
    rows of all pieces' rows joined, so a later piece reads positions shifted by earlier padding."""
    rows = torch.zeros(_padded(ln), 3)
    rows[:, 0] = start + torch.arange(_padded(ln), dtype=torch.float32)
    return torch.cat([rows, _pad_rows(ln)])


def _grids(m: NextDiT, siglip_feats, images, ends, noisy, dev):
    """(the grids' rows after the SigLIP refiner, their rotary table, their runs): each condition image's
    grid, flattened channel-major as the release does, at frame e_j + 1 with rows and columns scaled onto
    its latent's; the target's 32 pad rows at (0, 0, 0)."""
    b, n, gh, gw, c = siglip_feats.shape
    flat = siglip_feats.permute(0, 1, 4, 2, 3).reshape(
        b, n, gh * gw, c
    )  # per grid: permute(2,0,1).reshape(HW, C)
    embedded = m._caption(flat.reshape(b, n * gh * gw, c), m.siglip)
    rows, pos, runs, at = [], [], [], 0
    for j in range(n):
        rows.append(
            m._pad(embedded[:, j * gh * gw : (j + 1) * gh * gw], "siglip_pad_token", _padded(gh * gw))
        )
        grid = _grid_rows(ends[j] + 1, gh, gw)
        lh, lw = images[j].shape[-2:]  # the latent's size, not its patch grid's
        grid[:, 1] = (grid[:, 1] / max(gh - 1, 1) * (lh - 1)).to(torch.int32).float()
        grid[:, 2] = (grid[:, 2] / max(gw - 1, 1) * (lw - 1)).to(torch.int32).float()
        pos.append(torch.cat([grid, _pad_rows(gh * gw)]))
        runs.append((at, at + _padded(gh * gw), noisy[j]))
        at += _padded(gh * gw)
    token = held(m.pads, "siglip_pad_token", dev).to(dev, embedded.dtype)
    rows.append(token.expand(b, SEQ_MULTIPLE, -1))  # the target has no grid: one block of pad rows
    pos.append(torch.zeros(SEQ_MULTIPLE, 3))
    runs.append((at, at + SEQ_MULTIPLE, noisy[-1]))
    sig, pe = torch.cat(rows, 1), rope_table(torch.cat(pos).to(dev)[None], m.spec.axes, m.spec.theta)
    for blk in m.siglip_refiner:
        sig = m._block(blk, sig, pe, None)
    return sig, pe, runs


OPTIONAL = ("cap_lens", "cond_latents", "siglip_feats")


def random_omni(m: NextDiT, out: dict, g: torch.Generator) -> dict:
    """Random inputs for an edit step: `out`'s target, time and prompt states, plus one condition image
    of the target's size with its SigLIP2 grid, the prompt cut into its three pieces."""
    x, tokens = out["x"], out["cap_feats"].shape[1]
    out["cond_latents"] = torch.randn(x.shape[0], 1, *x.shape[1:], generator=g)
    width = wshape(m.siglip[1])[1]
    out["siglip_feats"] = torch.randn(x.shape[0], 1, SIGLIP_GRID, SIGLIP_GRID, width, generator=g)
    out["cap_lens"] = torch.tensor(
        [[PIECES[0], tokens - sum(PIECES), PIECES[1]]] * x.shape[0], dtype=torch.float32
    )
    return out


def omni_shapes(m: NextDiT, got: dict) -> dict:
    """The shapes of the Omni inputs `got` holds."""
    out = {}
    if "cap_lens" in got:
        out["cap_lens"] = (None, None)
    if "cond_latents" in got:
        out["cond_latents"] = (None, None, m.in_channels, None, None)
    if "siglip_feats" in got:
        out["siglip_feats"] = (None, None, None, None, wshape(m.siglip[1])[1])
    return out
