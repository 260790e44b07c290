"""`loadout decode`: a latent (.latent or .safetensors) through a VAE to a PNG, tiled when needed — a
client of the engine's Decode request, so the device, dtype and tiles are chosen as in the window."""

from __future__ import annotations

import argparse

from ..devices import add_device_arguments
from ..errors import EngineError, FormatError
from ..formatting import tiles_text
from ._common import EXIT_OK, human_bytes, print_json
from ._vae_common import StderrProgress, add_tile_arguments, engine_for, run_info, tiling, write_pngs

NAME = "decode"
HELP = "VAE decode a latent to a PNG, or a video latent to MP4 / WebP / PNG frames (full or tiled)"
DESCRIPTION = (
    "Decode a latent in the VAE's own space (a ComfyUI .latent or a safetensors latent) with a VAE or "
    "TAESD-family file and write a PNG. Without --tile the memory estimate decides: full when it fits, "
    "tiled (whole-image GroupNorm statistics, so no seams) when not. A batch writes NAME_0.png, NAME_1.png, ... "
    "A 5-D video latent (Wan 2.1 / 2.2 VAE) decodes in temporal chunks that carry the causal cache and "
    "writes --out clip.mp4 (H.264), clip.webp (animated), or DIR/ (000000.png, 000001.png, ...); "
    "T latent frames give 1 + 4 (T - 1) frames. LTX-Video's VAE (1 + 8 (T - 1) frames, 32x) decodes each chunk "
    "with context frames on both sides, its decoder not being causal. "
    "An audio latent (LTX-2's, MiniMax-H3's, Kandinsky 6's) decodes with --out SOUND.wav through the audio VAE of "
    "--vae and its vocoder (in LTX-2's checkpoint, or diffusers' vocoder/ beside audio_vae/, or --vocoder)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vae", required=True, metavar="FILE", help="VAE, checkpoint with a VAE, or TAESD decoder"
    )
    parser.add_argument("--latent", required=True, metavar="FILE", help=".latent or .safetensors latent")
    parser.add_argument(
        "--out", required=True, metavar="OUT",
        help="IMG.png, or for a video latent CLIP.mp4, CLIP.webp or DIR/ (one PNG per frame); written atomically",
    )  # fmt: skip
    parser.add_argument(
        "--fps", type=float, metavar="N", help="video frame rate (default: the family's, 16 or 24)"
    )
    parser.add_argument(
        "--decode-timestep", type=float, metavar="T",
        help="LTX-Video 0.9.1+: the timestep its decoder is conditioned on (default 0.05, the pipelines')",
    )  # fmt: skip
    parser.add_argument(
        "--decode-noise-scale", type=float, default=0.0, metavar="S",
        help="LTX-Video: mix S of seeded noise into the latent first, as its pipelines do (default 0: none)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="the noise's seed (--decode-noise-scale)")
    parser.add_argument(
        "--vocoder", metavar="FILE",
        help="audio: the vocoder's file, where --vae holds none (diffusers' vocoder/ is found beside audio_vae/)",
    )  # fmt: skip
    parser.add_argument(
        "--audio-latent", metavar="FILE",
        help="LTX-2: the clip's audio latent, decoded and muxed into the --out .mp4 as AAC",
    )  # fmt: skip
    parser.add_argument(
        "--audio-vae", metavar="FILE",
        help="the audio VAE of --audio-latent (default --vae: the release's checkpoint holds both)",
    )  # fmt: skip
    parser.add_argument(
        "--raw-latent", action="store_true",
        help="audio: the latent is already in the VAE's space (diffusers' output_type='latent'), not the denoiser's",
    )  # fmt: skip
    add_tile_arguments(parser, no_tile=True)
    add_device_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from ..formats.latent import latent_info
    from ..formats.video_out import kind_of, write_clip
    from ..requests import Decode

    if kind_of(args.out) == "wav":
        return _audio(args)
    _sound_instead(args)
    try:
        shape = latent_info(args.latent).shape  # header only: a bad latent is refused before torch loads
    except FormatError as e:
        _image_instead(args, e)
        raise
    kind = kind_of(args.out)  # a wrong suffix is refused before the decode, not after
    if len(shape) == 4 and kind in ("mp4", "webp"):
        raise EngineError(f"{args.latent} is an image latent {list(shape)}: write a .png or a folder/")
    if args.audio_latent and kind != "mp4":
        raise EngineError(f"{args.out}: a clip with sound (--audio-latent) goes to a .mp4")
    engine, _ = engine_for(args)
    try:
        extra = dict(
            decode_timestep=args.decode_timestep, decode_noise_scale=args.decode_noise_scale, seed=args.seed
        )
        res = engine.run(
            Decode(args.vae, args.latent, **tiling(args), **extra), report=StderrProgress(args.quiet)
        )
        fps = args.fps or res.fps or 16.0
        sound = _sound(engine, args) if args.audio_latent else None
        if res.frames:
            audio = (sound.samples, sound.channels, sound.sample_rate) if sound is not None else None
            paths = write_clip(args.out, res.frames, res.width, res.height, fps, audio=audio)
        elif kind == "frames":
            paths = write_clip(args.out, (res.rgb,), res.width, res.height, fps)
        else:
            paths = write_pngs(res, args.out, shape[0])
    finally:
        engine.close()
    info = run_info(res.info)
    device = res.info["device"]
    result = {
        "vae": args.vae,
        "latent": args.latent,
        "outputs": paths,
        "size": [res.width, res.height],
        **({"frames": len(res.frames), "fps": fps} if res.frames else {}),
        **(
            {"audio_seconds": round(sound.info["audio_seconds"], 3), "sample_rate": sound.sample_rate}
            if sound
            else {}
        ),
        "device": device,
        "seconds": round(res.seconds, 3),
        **info,
    }
    if args.json:
        print_json(result)
    else:
        how = (
            tiles_text(info["tiles"], info["tile_px"])
            + (f" (overlap {info['overlap_px']})" if info["tiles"] > 1 else "")
            if info["mode"] == "tiled"
            else "full"
        )
        if res.frames:
            how += f", {info['tile_frames']} latent frames per chunk"
            how += ", retry snapshots in host RAM" if info.get("snapshot") == "host" else ""
        size = f"{len(res.frames)} frames of " if res.frames else ""
        print(
            f"decoded {tuple(shape)} -> {size}{res.width}x{res.height} on {device} ({info['dtype']}, "
            f"{how}) in {res.seconds:.1f} s; estimate {human_bytes(info['estimate_bytes'])} for a full decode"
            + (f", {human_bytes(info['tiling_estimate_bytes'])} as tiled" if info["mode"] == "tiled" else "")
        )
        for n in info["notes"]:
            print(f"  note: {n}")
        if sound is not None:
            print(f"  with {sound.info['audio_seconds']:.2f} s of sound at {sound.sample_rate} Hz (AAC)")
        for p in paths:
            print(f"  wrote {p}")
    return EXIT_OK


def _sound(engine, args: argparse.Namespace):
    """The clip's sound (--audio-latent) through the audio VAE of --audio-vae or --vae."""
    from ..requests import DecodeAudio

    req = DecodeAudio(
        args.audio_vae or args.vae, args.audio_latent, vocoder=args.vocoder, raw=args.raw_latent
    )
    return engine.run(req, report=StderrProgress(args.quiet))


def _audio(args: argparse.Namespace) -> int:
    """An audio latent to a WAV file (16-bit PCM at the vocoder's rate)."""
    from ..formats.audio_out import write_wav
    from ..requests import DecodeAudio

    engine, _ = engine_for(args)
    try:
        req = DecodeAudio(args.audio_vae or args.vae, args.latent, vocoder=args.vocoder, raw=args.raw_latent)
        res = engine.run(req, report=StderrProgress(args.quiet))
        write_wav(args.out, res.samples, res.channels, res.sample_rate)
    finally:
        engine.close()
    info = dict(res.info)
    secs = info["audio_seconds"]
    result = {"vae": args.vae, "latent": args.latent, "outputs": [args.out], "channels": res.channels,
              "sample_rate": res.sample_rate, "audio_seconds": round(secs, 3), "device": info["device"],
              "seconds": round(res.seconds, 3), "latent_shape": info["latent_shape"], "vocoder": info["vocoder"],
              "normalised": info["normalised"], "estimate_bytes": info["estimate_bytes"], "notes": list(info["notes"])}  # fmt: skip
    if args.json:
        print_json(result)
        return EXIT_OK
    chans = {1: "mono", 2: "stereo"}.get(res.channels, f"{res.channels} channels")
    print(f"decoded {tuple(info['latent_shape'])} -> {secs:.2f} s of {chans} at {res.sample_rate} Hz on "
          f"{info['device']} (float32, {info['vocoder']} vocoder) in {res.seconds:.1f} s; "
          f"estimate {human_bytes(info['estimate_bytes'])} of working memory")  # fmt: skip
    for n in info["notes"]:
        print(f"  note: {n}")
    print(f"  wrote {args.out}")
    return EXIT_OK


def _sound_instead(args: argparse.Namespace) -> None:
    """An audio latent given for a picture or a clip: say how it decodes."""
    from ..formats.latent import audio_latent_key

    try:
        key = audio_latent_key(args.latent)
    except Exception:  # noqa: BLE001 -- not a readable latent: the decode says what is wrong with it
        return
    if key is not None:
        raise EngineError(f"{args.latent} holds an audio latent ({key}): decode it to a .wav, or give it with "
                          "--audio-latent beside a clip's latent to put the sound in the .mp4")  # fmt: skip


def _image_instead(args: argparse.Namespace, e: FormatError) -> None:
    """An image given as the latent: say which command makes a latent of it."""
    import os

    from ..formats.magic import what_file_is

    if os.path.isfile(args.latent) and what_file_is(args.latent).endswith(" image"):
        raise FormatError(
            f"{e.message}; make a latent of it first: "
            f"loadout encode --vae VAE --image {args.latent} --out {os.path.splitext(args.latent)[0]}.latent"
        ) from e
