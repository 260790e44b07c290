"""First run: find the model libraries of the user's existing tools (ComfyUI, ComfyUI Desktop, A1111 /
Forge, InvokeAI, Stability Matrix, SwarmUI) without a long crawl, so the window can offer to scan them.

The search is bounded: a fixed list of likely places (home, Documents, Desktop, AI, src, git, apps, /opt,
other drive roots on Windows), a few directory levels deep, hidden and heavy folders skipped, a cap on
the folders looked at and a time budget. Each result says what it is, its root, the model folders with
file counts and total bytes (os.scandir + stat only: no file is opened, except the small config files
that name model folders) and the marker files that identified it.

Facts used (cited, not copied):
* ComfyUI (git or portable): `main.py`, the `comfy/` package and `folder_paths.py` at its root, models in
  `models/<folder>`, more folders in `extra_model_paths.yaml` beside main.py (ComfyUI README and
  extra_model_paths.yaml.example); the Windows portable build puts `ComfyUI/` beside `python_embeded/`.
* ComfyUI Desktop (Comfy-Org/desktop README, "Installed Files"): user files in %APPDATA%\\ComfyUI on
  Windows, ~/Library/Application Support/ComfyUI on macOS, ~/.config/ComfyUI on Linux; its
  `extra_models_config.yaml` lives there (ComfyServerConfig.configPath = userData + that name) and
  names the install's base path (the setup wizard's default is Documents/ComfyUI).
* A1111 / Forge: `webui.py` / `launch.py` and `models/Stable-diffusion`; Forge adds `modules_forge/`.
* InvokeAI (invoke-ai.github.io, "Configuration"): the root is $INVOKEAI_ROOT, else ~/invokeai; it holds
  `invokeai.yaml`, whose `models_dir` may move the models folder (default `models`).
* Stability Matrix (its README: "move Stability Matrix's Data Directory"): a `Data` folder with the
  shared `Models/` store and `Packages/`; the data folder itself is found by those two sub-folders.
* SwarmUI: a root with `launch-linux.sh` / `launch-windows.bat` / `launch-macos.sh`, `src/` and
  `Models/` (its default model root). Folder names inside are counted generically, not assumed.
"""

from __future__ import annotations

import os
import string
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .catalog.layout import declared_kind_for_folder, is_model_file, read_extra_model_paths
from .errors import FormatError

# Folder names never worth descending into while looking for installs (big, or not the user's tools).
_SKIP = {
    "node_modules", "__pycache__", "site-packages", "venv", "env", "python_embeded", "Library",
    "AppData", "Windows", "Program Files", "Program Files (x86)", "ProgramData", "$Recycle.Bin",
    "System Volume Information", "snap", "proc", "sys", "dev", "outputs", "output", "input", "models",
    "Models", "custom_nodes", "extensions", "repositories", "Pictures", "Music", "Videos",
}  # fmt: skip
_HOME_PLACES = ("", "Documents", "Desktop", "Downloads", "AI", "ai", "src", "git", "apps", "Apps",
                "projects", "Projects", "code", "stable-diffusion", "StableDiffusion", "invokeai")  # fmt: skip
MAX_DEPTH = 3
MAX_DIRS = 4000
MAX_FILES_PER_FOLDER = 50_000


@dataclass(frozen=True)
class ModelFolder:
    path: str
    kind: str | None  # the folder's declared kind (catalog.layout), None when the name says nothing
    files: int  # model files (catalog.layout.MODEL_SUFFIXES) below it
    bytes: int
    truncated: bool = False  # stopped counting at MAX_FILES_PER_FOLDER

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Install:
    """One tool's library: `app` is comfyui | comfyui_desktop | a1111 | forge | invokeai |
    stability_matrix | swarmui; `scan_paths` are the folders to give the library scan."""

    app: str
    label: str
    root: str
    folders: tuple[ModelFolder, ...]
    evidence: tuple[str, ...]
    scan_paths: tuple[str, ...]
    problems: tuple[str, ...] = field(default=())

    @property
    def files(self) -> int:
        return sum(f.files for f in self.folders)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.folders)

    def to_json(self) -> dict:
        return {
            "app": self.app, "label": self.label, "root": self.root, "files": self.files,
            "bytes": self.bytes, "scan_paths": list(self.scan_paths),
            "folders": [f.to_json() for f in self.folders], "evidence": list(self.evidence),
            "problems": list(self.problems),
        }  # fmt: skip


def count_models(path: str) -> ModelFolder:
    """Model files below `path` and their total size, from directory entries only (stat, no reads)."""
    files = total = 0
    stack = [path]
    truncated = False
    while stack and not truncated:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=True):
                        if not e.name.startswith("."):
                            stack.append(e.path)
                    elif is_model_file(e.name):
                        files += 1
                        total += e.stat().st_size
                        if files >= MAX_FILES_PER_FOLDER:
                            truncated = True
                            break
                except OSError:
                    continue
    return ModelFolder(path, declared_kind_for_folder(os.path.basename(path)), files, total, truncated)


def _subfolders(models_dir: str) -> list[str]:
    try:
        return sorted(e.path for e in os.scandir(models_dir) if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return []


def _folders(paths: list[str]) -> tuple[ModelFolder, ...]:
    """Counted folders, each real folder once (symlinked shared stores are common), empty ones left out."""
    seen: set[str] = set()
    out = []
    for p in paths:
        real = os.path.realpath(p)
        if real in seen or not os.path.isdir(p):
            continue
        seen.add(real)
        f = count_models(p)
        if f.files:
            out.append(f)
    return tuple(out)


def _yaml_roots(yaml_path: str, problems: list[str]) -> list[str]:
    try:
        return [r.path for r in read_extra_model_paths(yaml_path)]
    except FormatError as e:
        problems.append(e.message)
        return []


def _has(d: str, *names: str) -> list[str]:
    return [n for n in names if os.path.exists(os.path.join(d, n))]


def _comfyui(d: str) -> Install | None:
    marks = _has(d, "main.py", "comfy", "folder_paths.py", "models")
    if not {"main.py", "comfy", "models"} <= set(marks):
        return None
    parent = os.path.dirname(d)
    portable = os.path.isdir(os.path.join(parent, "python_embeded"))
    evidence = [os.path.join(d, m) for m in marks]
    if portable:
        evidence.append(os.path.join(parent, "python_embeded"))
    problems: list[str] = []
    models = os.path.join(d, "models")
    paths = _subfolders(models)
    scan = [models]
    yml = os.path.join(d, "extra_model_paths.yaml")
    if os.path.isfile(yml):
        evidence.append(yml)
        extra = _yaml_roots(yml, problems)
        paths += extra
        scan += [p for p in extra if os.path.isdir(p)]
    label = "ComfyUI (portable)" if portable else "ComfyUI"
    return Install("comfyui", label, d, _folders(paths), tuple(evidence), _dedupe(scan), tuple(problems))


def _comfyui_desktop_base(d: str) -> Install | None:
    """A ComfyUI Desktop base path: models/, user/ and custom_nodes/ without main.py (the code lives in
    the app's resources)."""
    marks = _has(d, "models", "user", "custom_nodes", ".venv")
    if not {"models", "user", "custom_nodes"} <= set(marks) or os.path.exists(os.path.join(d, "main.py")):
        return None
    models = os.path.join(d, "models")
    return Install("comfyui_desktop", "ComfyUI Desktop", d, _folders(_subfolders(models)),
                   tuple(os.path.join(d, m) for m in marks), (models,))  # fmt: skip


def _a1111(d: str) -> Install | None:
    marks = _has(d, "webui.py", "launch.py", "models/Stable-diffusion", "modules_forge", "embeddings")
    if not ({"webui.py", "launch.py"} & set(marks)) or "models/Stable-diffusion" not in marks:
        return None
    forge = "modules_forge" in marks
    models = os.path.join(d, "models")
    paths = _subfolders(models) + [os.path.join(d, "embeddings")]
    scan = [models] + ([os.path.join(d, "embeddings")] if "embeddings" in marks else [])
    return Install("forge" if forge else "a1111", "Forge" if forge else "AUTOMATIC1111 WebUI", d,
                   _folders(paths), tuple(os.path.join(d, m) for m in marks), tuple(scan))  # fmt: skip


def _invokeai(d: str) -> Install | None:
    yml = os.path.join(d, "invokeai.yaml")
    if not os.path.isfile(yml):
        return None
    problems: list[str] = []
    models = os.path.join(d, "models")
    try:
        import yaml

        conf = yaml.safe_load(Path(yml).read_text(encoding="utf-8")) or {}
        md = conf.get("models_dir") if isinstance(conf, dict) else None
        if md:
            md = os.path.expanduser(os.path.expandvars(str(md)))
            models = md if os.path.isabs(md) else os.path.join(d, md)
    except (OSError, ValueError, yaml.YAMLError) as e:
        problems.append(f"{yml}: cannot read models_dir ({e}); using {models}")
    if not os.path.isdir(models):
        return None
    return Install("invokeai", "InvokeAI", d, _folders([models]), (yml,), (models,), tuple(problems))


def _stability_matrix(d: str) -> Install | None:
    data = os.path.join(d, "Data")
    for base in (data, d):
        if os.path.isdir(os.path.join(base, "Models")) and os.path.isdir(os.path.join(base, "Packages")):
            models = os.path.join(base, "Models")
            ev = (models, os.path.join(base, "Packages"))
            return Install("stability_matrix", "Stability Matrix (shared models)", base,
                           _folders(_subfolders(models)), ev, (models,))  # fmt: skip
    return None


def _swarmui(d: str) -> Install | None:
    launch = _has(d, "launch-linux.sh", "launch-windows.bat", "launch-macos.sh")
    if (
        not launch
        or not os.path.isdir(os.path.join(d, "src"))
        or not os.path.isdir(os.path.join(d, "Models"))
    ):
        return None
    models = os.path.join(d, "Models")
    ev = tuple(os.path.join(d, m) for m in [*launch, "src", "Models"])
    return Install("swarmui", "SwarmUI", d, _folders(_subfolders(models)), ev, (models,))


IDENTIFIERS = (_comfyui, _a1111, _invokeai, _swarmui, _stability_matrix, _comfyui_desktop_base)


def identify(d: str) -> Install | None:
    """What install `d` is the root of, or None."""
    for ident in IDENTIFIERS:
        found = ident(d)
        if found is not None:
            return found
    return None


def _dedupe(paths: list[str]) -> tuple[str, ...]:
    seen, out = set(), []
    for p in paths:
        r = os.path.realpath(p)
        if r not in seen:
            seen.add(r)
            out.append(p)
    return tuple(out)


def comfyui_desktop_config_dir(home: Path, platform: str = sys.platform) -> Path:
    """Where ComfyUI Desktop keeps extra_models_config.yaml (Electron's userData for the app)."""
    if platform == "win32":
        return Path(os.environ.get("APPDATA") or home / "AppData" / "Roaming") / "ComfyUI"
    if platform == "darwin":
        return home / "Library" / "Application Support" / "ComfyUI"
    return Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "ComfyUI"


def _comfyui_desktop_config(home: Path, platform: str) -> Install | None:
    yml = comfyui_desktop_config_dir(home, platform) / "extra_models_config.yaml"
    if not yml.is_file():
        return None
    problems: list[str] = []
    roots = _yaml_roots(str(yml), problems)
    base = None
    try:
        import yaml

        conf = yaml.safe_load(yml.read_text(encoding="utf-8")) or {}
        for sec in conf.values() if isinstance(conf, dict) else ():
            if isinstance(sec, dict) and sec.get("base_path"):
                base = os.path.expanduser(str(sec["base_path"]))
                break
    except (OSError, ValueError, yaml.YAMLError):
        pass
    root = base or str(yml.parent)
    scan = [r for r in roots if os.path.isdir(r)]
    return Install("comfyui_desktop", "ComfyUI Desktop", root, _folders(roots), (str(yml),),
                   _dedupe(scan), tuple(problems))  # fmt: skip


def search_places(home: Path, platform: str = sys.platform, system: bool = True) -> list[Path]:
    """The folders to look below: likely spots in the home folder, then system-wide ones."""
    places = [home / p if p else home for p in _HOME_PLACES]
    if system:
        if platform == "win32":
            for letter in string.ascii_uppercase[2:]:
                drive = Path(f"{letter}:\\")
                if drive.exists():
                    places.append(drive)
        else:
            places += [Path("/opt"), Path("/srv"), Path("/data"), Path("/workspace")]
            if platform == "darwin":
                places.append(Path("/Applications"))
    return [p for p in places if p.is_dir()]


def find_installs(
    home: str | os.PathLike | None = None,
    *,
    places: list[Path] | None = None,
    system: bool = True,
    platform: str = sys.platform,
    max_depth: int = MAX_DEPTH,
    budget_s: float = 4.0,
) -> list[Install]:
    """Installs found in the likely places (see module doc), each once, biggest library first."""
    home_p = Path(home) if home is not None else Path.home()
    found: dict[str, Install] = {}

    def add(inst: Install | None) -> None:
        if inst is not None:
            found.setdefault(os.path.realpath(inst.root), inst)

    add(_comfyui_desktop_config(home_p, platform))
    inv = os.environ.get("INVOKEAI_ROOT")
    for d in ([inv] if inv else []) + [str(home_p / "invokeai")]:
        if os.path.isdir(d):
            add(_invokeai(d))
    for sm in (comfyui_desktop_config_dir(home_p, platform).parent / "StabilityMatrix",):
        if sm.is_dir():
            add(_stability_matrix(str(sm)))

    deadline = time.monotonic() + budget_s
    visited: set[str] = set()
    queue = [(str(p), 0) for p in (places if places is not None else search_places(home_p, platform, system))]
    while queue and len(visited) < MAX_DIRS and time.monotonic() < deadline:
        d, depth = queue.pop(0)
        real = os.path.realpath(d)
        if real in visited:
            continue
        visited.add(real)
        inst = identify(d)
        if inst is not None:
            add(inst)
            continue
        if depth >= max_depth:
            continue
        try:
            with os.scandir(d) as it:
                subs = [
                    e.path for e in it if e.is_dir() and not e.name.startswith(".") and e.name not in _SKIP
                ]
        except OSError:
            continue
        queue += [(s, depth + 1) for s in sorted(subs)]
    return sorted(found.values(), key=lambda i: (-i.bytes, i.root))
