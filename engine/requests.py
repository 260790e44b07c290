"""The engine facade's requests and results: frozen dataclasses, so they can cross threads (the GUI
sends requests through queued signals and reads results in its own thread).

Torch-free and cheap to import: the GUI thread imports these before torch has loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType


def frozen(value):
    """A read-only copy of JSON-like data (dicts become read-only mappings, lists tuples), so a
    result handed to another thread cannot be changed under the reader."""
    if isinstance(value, dict):
        return MappingProxyType({k: frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


# -- requests ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DetectDevices:
    options: object  # engine.devices.DeviceOptions


@dataclass(frozen=True)
class Scan:
    paths: tuple[str, ...]


@dataclass(frozen=True)
class Inspect:
    """One Detection per file from its header alone (torch-free, so it may run before torch loads)."""

    paths: tuple[str, ...]
    read_values: bool = False  # also read the few weight values SD2's v-prediction check needs


@dataclass(frozen=True)
class HashFiles:
    items: tuple[tuple[str, int, int], ...]  # (path, size, mtime_ns) as the scan saw them


@dataclass(frozen=True)
class Load:
    path: str
    components: tuple[str, ...] = ()  # empty: every component detection found


@dataclass(frozen=True)
class Unload:
    path: str
    component: str
    nbytes: int | None = None  # None: unload completely; else free this many device bytes


@dataclass(frozen=True)
class UnloadAll:
    pass


@dataclass(frozen=True)
class Pin:
    path: str
    component: str
    pinned: bool


@dataclass(frozen=True)
class LoraCoverage:
    lora: str
    base: str


@dataclass(frozen=True)
class StackItem:
    file: str
    strength_model: float = 1.0
    strength_clip: float = 1.0
    enabled: bool = True


@dataclass(frozen=True)
class SetLoras:
    base: str
    stack: tuple[StackItem, ...]


@dataclass(frozen=True)
class Bake:
    base: str
    stack: tuple[StackItem, ...]
    out: str


@dataclass(frozen=True)
class PlanRequest:
    model: str
    loras: tuple[str, ...] = ()
    decode: tuple[int, int] | None = None
    vram_gb: float | None = None  # a hypothetical device of this size (GiB); None: the detected one


# The window's background work: found, written or read off the GUI thread (the window never scans the
# disk, writes files or reads headers itself).


@dataclass(frozen=True)
class FindLibraries:
    """First run: the model libraries of the user's other tools (engine.discover); a tuple of Install."""


@dataclass(frozen=True)
class WriteDemo:
    """Write the demo library into `folder` (engine.catalog.demo; its small dense files need torch)."""

    folder: str


@dataclass(frozen=True)
class EstimateDecode:
    """'Will it fit?' before a decode of `source` (an image there means an encode), from headers alone:
    the input's size and the VAE's kind and weight bytes. Answered by a DecodeEstimate."""

    vae: str
    source: str  # a latent file, or an image to encode
    tile: int = 512  # output pixels, for the tiled figure


# -- results ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HashResult:
    hashed: tuple[tuple[str, str], ...]  # (path, sha256)
    skipped: tuple[tuple[str, str], ...]
    failed: tuple[tuple[str, str], ...]
    old_hashes: tuple[tuple[str, str], ...] = ()  # (path, A1111's old "model hash") of the hashed files


@dataclass(frozen=True)
class LedgerResult:
    """What a residency request did, with the ledger after it."""

    snapshot: object  # engine.residency.LedgerSnapshot (frozen)
    bytes: int = 0
    message: str = ""


@dataclass(frozen=True)
class CoverageResult:
    lora: str
    base: str
    coverage: MappingProxyType  # DESIGN.md's LoRA coverage JSON, read-only (see `frozen`)


@dataclass(frozen=True)
class LorasApplied:
    base: str
    stack: tuple[StackItem, ...]
    patched: int
    restored: int
    unchanged: int
    coverages: tuple[CoverageResult, ...] = field(default=())
    patched_units: MappingProxyType = field(
        default_factory=lambda: MappingProxyType({})
    )  # component -> frozenset


@dataclass(frozen=True)
class Baked:
    out: str
    bytes: int
    patched_keys: int = 0
    loras: tuple[dict, ...] = ()  # per merged LoRA: file, sha256, strength_model/clip, modules, mapped


# -- device options, decode and encode ------------------------------------------------------------------


@dataclass(frozen=True)
class Configure:
    """Apply device options now: detect devices again and rebuild the residency budget. Components
    stay loaded when only the budget changes (--reserve-vram, --vram-budget, --disable-smart-memory);
    anything that changes where or how they are placed unloads them first (see `unloads_components`)."""

    options: object  # engine.devices.DeviceOptions


@dataclass(frozen=True)
class Decode:
    vae: str
    latent: str
    mode: str = "auto"  # auto | full | tiled
    tile: int = 512  # output pixels (tiled mode)
    overlap: int = 64
    tile_frames: int | None = None  # video: latent frames per temporal chunk (None: as the budget allows)
    overlap_frames: int = 0  # video: warm-up latent frames when a chunk restarts without its cache
    # A timestep-conditioned video decoder's inputs (LTX-Video 0.9.1+, engine.vae.ltx): the timestep it
    # decodes at (None: the pipelines' 0.05), and the share of seeded noise mixed into the latent first
    # (the pipelines' decode_noise_scale; 0: the latent decodes as it is)
    decode_timestep: float | None = None
    decode_noise_scale: float = 0.0
    seed: int = 0


@dataclass(frozen=True)
class DecodeAudio:
    """An audio latent through an audio VAE's decoder (and vocoder) to a waveform (engine.vae.audio_loading): LTX-2's
    (the denoiser's [B, T, 128] tokens or the VAE's [B, 8, T, 16]), MiniMax-H3's ([B, N, 32] stereo rows) or Kandinsky
    6's ([B, T, 40] tokens through MMAudio's mel VAE and vocoder)."""

    vae: str  # LTX-2's checkpoint (audio_vae.* and vocoder.*), or diffusers' audio_vae/ weights
    latent: str
    vocoder: str | None = None  # where `vae` holds none (diffusers' vocoder/ is found beside audio_vae/)
    raw: bool = (
        False  # the latent is already in the VAE's space (diffusers' output_type="latent"): no un-normalising
    )


@dataclass(frozen=True)
class AudioResult:
    samples: bytes  # float32 little-endian, interleaved by channel (frame-major)
    channels: int
    sample_rate: int
    info: MappingProxyType  # device, latent_shape, seconds of audio, notes
    seconds: float  # the decode's time
    source: str


@dataclass(frozen=True)
class EncodeAudio:
    """A sound (any file FFmpeg reads) through an audio VAE's encoder to its normalised latent, written to `out`: LTX-2's
    as a ComfyUI .latent [1, 8, T, 16], MiniMax-H3's rows [1, 2T, 32] as `audio_hidden_states` (engine.sound)."""

    vae: str
    audio: str
    out: str
    seconds: float | None = None  # at most the sound's first N seconds (None: all of it)


@dataclass(frozen=True)
class EncodedAudio:
    out: str
    info: MappingProxyType  # device, latent_shape, audio_seconds, source_rate, channels, notes
    seconds: float


@dataclass(frozen=True)
class Encode:
    vae: str
    image: str
    out: str
    mode: str = "auto"
    tile: int = 512
    overlap: int | None = None  # None: the VAE's own (its receptive field: 128 px for SD and TAESD encoders)
    round_trip: bool = True  # also decode the latent back for DecodeResult.rgb (the window shows it)
    frames: int | None = None  # a clip (engine.vae.clips): encode at most its first N frames (None: all)


@dataclass(frozen=True)
class DecodeResult:
    width: int
    height: int
    rgb: bytes  # height * width * 3, row-major
    info: (
        MappingProxyType  # engine.vae RunInfo JSON (read-only): mode, tiles, tile_px, ... and "vae_component"
    )
    seconds: float
    source: str  # the latent (decode) or the written latent file (encode)
    images: tuple[bytes, ...] = ()  # a batch: every image, as rgb (rgb is the first); () for one image
    frames: tuple[bytes, ...] = ()  # a video: every frame of the first clip, as rgb (rgb is frame 0)
    fps: float = 0.0  # a video: the family's frame rate (Wan 2.1 16, Wan 2.2 24)


@dataclass(frozen=True)
class DecodeEstimate:
    """Predicted peak bytes of running an EstimateDecode whole and in tiles (engine.vae.estimate)."""

    direction: str  # decode | encode
    width: int  # output pixels
    height: int
    full_bytes: int
    # the least a tiled run needs: `tile`-px tiles one at a time, states on disk (a run with memory to
    # spare batches small tiles up to a quarter of what is free, and may keep the states beside them)
    tiled_bytes: int
    tile: int
    frames: int = 0  # a video latent: output frames (0: an image)
    media: str = "image"  # "image", "video" or "sound" (decoded whole: no size, full and tiled the same)


@dataclass(frozen=True)
class SaveClip:
    """Write a decoded clip (DecodeResult.frames) to `out`: .mp4, .webp, or a folder/ of PNG frames,
    atomically (engine.formats.video_out), off the GUI thread."""

    out: str
    frames: tuple[bytes, ...]
    width: int
    height: int
    fps: float


@dataclass(frozen=True)
class SaveAudio:
    """Write decoded sound (AudioResult.samples) to `out` as a 16-bit WAV, atomically (engine.formats.audio_out),
    off the GUI thread."""

    out: str
    samples: bytes
    channels: int
    sample_rate: int


@dataclass(frozen=True)
class SavedClip:
    paths: tuple[str, ...]


@dataclass(frozen=True)
class Configured:
    """What Configure did: the new device report, the ledger after it and what was unloaded/evicted."""

    report: object  # engine.devices.DeviceReport
    snapshot: object  # engine.residency.LedgerSnapshot
    unloaded: tuple[str, ...] = ()
    evicted_bytes: int = 0


@dataclass(frozen=True)
class Step:
    """Run the denoiser of `model` (or its `component`, e.g. a text encoder) for `steps` forward passes
    under the residency manager (`loadout step`). `loras`: set this LoRA stack on the model first (as SetLoras); None keeps the one applied.
    `inputs`: a .safetensors file of the forward's inputs (engine.denoise.inputs says which), else
    seeded random ones for an image of `size` = (width, height) pixels. `out`: write the last
    output there as the float32 tensor `out`."""

    model: str
    loras: tuple[StackItem, ...] | None = None
    inputs: str | None = None
    size: tuple[int, int] = (512, 512)
    steps: int = 1
    out: str | None = None
    seed: int = 0
    component: str | None = None  # which of the file's components: default its denoiser, else a text encoder


@dataclass(frozen=True)
class StepResult:
    """What a Step measured. Bytes: `peak_device_bytes` is the peak above the level before the job
    (CUDA: torch's allocated bytes; CPU: the process's peak RSS), `resident_bytes` the denoiser's bytes
    on the device, `streamed_bytes_per_step` what each forward read of its offloaded modules."""

    model: str
    component: str
    architecture: str
    naming: str
    device: str
    dtype: str
    mode: str  # full | partial
    steps: int
    s_per_step: float  # median
    first_step_s: float
    step_seconds: tuple[float, ...]
    peak_device_bytes: int
    resident_bytes: int
    streamed_bytes_per_step: int
    input_shapes: MappingProxyType  # name -> shape (read-only)
    output_shape: tuple[int, ...]
    out: str | None = None
    snapshot: object = None  # engine.residency.LedgerSnapshot after the run
    prefetched: float = 0.0  # share of streamed modules whose bytes were already there when asked
    step_cpu_seconds: tuple[
        float, ...
    ] = ()  # the process's CPU time per step (all threads, the reader's too)
    # the LoRAs the request set on the model, one read-only mapping each: file, strength_model,
    # strength_clip, modules, mapped (how many of them reach this model), warning (None, or why it fits badly)
    loras: tuple[MappingProxyType, ...] = ()
    # tensors of the --inputs file this model's forward does not take (e.g. SDXL's `y` given to SD1):
    # not an error -- one file may serve two variants -- but said, since a misspelt name lands here
    ignored_inputs: tuple[str, ...] = ()

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "snapshot"}
        d["step_seconds"] = list(self.step_seconds)
        d["step_cpu_seconds"] = list(self.step_cpu_seconds)
        d["loras"] = [dict(x) for x in self.loras]
        d["ignored_inputs"] = list(self.ignored_inputs)
        d["input_shapes"] = {k: list(v) for k, v in self.input_shapes.items()}
        d["output_shape"] = list(self.output_shape)
        return d


# Options that only change the budget: the components may stay where they are.
BUDGET_ONLY_OPTIONS = frozenset(
    {"reserve_vram_gb", "vram_budget_gb", "inference_memory_gb", "disable_smart_memory"}
)


def unloads_components(old, new) -> bool:
    """Whether moving from DeviceOptions `old` to `new` changes where or in which dtype components are
    placed (device, VRAM mode, --cpu-vae, dtype flags): then Configure unloads everything first."""
    return any(
        getattr(old, f.name) != getattr(new, f.name) for f in fields(new) if f.name not in BUDGET_ONLY_OPTIONS
    )
