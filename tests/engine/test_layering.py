"""The engine's import rules: no Qt anywhere in engine/, and no torch when the GUI thread imports the
light modules (the window must appear before torch is loaded)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("PySide6", "shiboken6", "pyqtgraph", "app")


def _imports(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def test_engine_never_imports_qt_or_the_app():
    bad = [
        f"{p.relative_to(ROOT)}:{line} imports {mod}"
        for p in sorted((ROOT / "engine").rglob("*.py"))
        for line, mod in _imports(p)
        if mod.split(".")[0] in FORBIDDEN
    ]
    assert not bad, "engine/ must stay Qt-free:\n" + "\n".join(bad)


def test_import_linter_contract_holds():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(exe).exists():
        pytest.skip("import-linter is not installed (pip install import-linter)")
    r = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_light_engine_modules_do_not_import_torch():
    code = (
        "import sys\n"
        "import engine, engine.memory, engine.formats, engine.devices, engine.cli, engine.requests\n"
        "import engine.facade  # the bridge imports it in the GUI thread\n"
        "engine.cli.build_parser()  # imports every sub-command module\n"
        "engine.memory.sample()\n"
        "bad = sorted(m for m in ('torch', 'PySide6') if m in sys.modules)\n"
        "print(','.join(bad) or 'clean')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "clean", f"imported at module level: {r.stdout.strip()}"


def test_a_warm_scan_imports_neither_the_rules_nor_other_commands(tmp_path):
    """`loadout scan` on a library the cache already knows detects nothing: the detection rules, the
    format readers, the worker pool and the other sub-commands stay unimported (issue 14: a warm
    re-scan's time is mostly imports)."""
    lib = tmp_path / "models" / "vae"
    lib.mkdir(parents=True)
    from engine.formats.safetensors import write_sparse

    write_sparse(lib / "tiny.safetensors", [("decoder.conv_in.weight", "F16", (512, 4, 3, 3))], None)
    code = (
        "import sys, runpy\n"
        "sys.argv = ['loadout', 'scan', '--json', sys.argv[1]]\n"
        "from engine.cli import main\n"
        "rc = main()\n"
        "mods = [m for m in ('engine.detect.core', 'engine.formats', 'multiprocessing', 'engine.cli.step',"
        " 'engine.cli.decode', 'engine.devices') if m in sys.modules]\n"
        "print('IMPORTED', ','.join(mods) or 'none', file=sys.stderr)\n"
    )
    env = {**os.environ, "LOADOUT_CACHE_DIR": str(tmp_path / "cache")}
    runs = [
        subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
        for _ in range(2)
    ]  # fmt: skip
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert json.loads(runs[1].stdout)[0]["library"]["from_cache"] is True
    imported = runs[1].stderr.strip().rpartition("IMPORTED ")[2]
    assert imported == "none", f"a warm scan imported {imported}"
    assert "engine.detect.core" in runs[0].stderr  # the cold one did detect


def test_engine_detect_exports_resolve_lazily():
    import engine.detect as d

    for name in d.__all__:
        assert getattr(d, name) is not None, name
    assert d.detect_file is __import__("engine.detect.file", fromlist=["x"]).detect_file
    assert len(d.__version__) == 12 or d.__version__ == "frozen"
    assert set(d.__all__) <= set(dir(d))
    with pytest.raises(AttributeError):
        d.no_such_name  # noqa: B018


def test_no_import_cycle_between_engine_packages():
    """Importing engine.model.x counts as importing engine.model; imports inside functions and under
    TYPE_CHECKING count too (grimp sees every import statement)."""
    import collections

    grimp = pytest.importorskip("grimp")
    g = grimp.build_graph("engine", include_external_packages=False)

    def top(m: str) -> str:
        return ".".join(m.split(".")[:2])

    adj = collections.defaultdict(set)
    for m in g.modules:
        for i in g.find_modules_directly_imported_by(m):
            if top(m) != top(i) and top(i) != "engine":  # the root package only carries __version__
                adj[top(m)].add(top(i))

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            x = todo.pop()
            for y in adj[x]:
                if y == b:
                    return True
                if y not in seen:
                    seen.add(y)
                    todo.append(y)
        return False

    cycles = sorted({tuple(sorted((a, b))) for a in list(adj) for b in adj[a] if reaches(b, a)})
    assert not cycles, f"import cycles between engine packages: {cycles}"


def test_header_only_commands_never_import_torch(tmp_path):
    """`loadout inspect`, `lora inspect` and `scan` run through the Engine facade and stay torch-free
    (they answer before torch could load), on safetensors, torch-zip and legacy pickle files alike."""
    import os

    import torch
    from loadout_test_support import data_file

    from tests.support import synth

    lokr = data_file("weights/smart_falcon_8_lokr.safetensors")
    pth = data_file("weights/taef2_decoder.pth")  # a torch zip
    base = synth.write("sd1_checkpoint", tmp_path / "models" / "sd15.safetensors")
    ckpt = tmp_path / "legacy.ckpt"
    torch.save({"state_dict": {"a": torch.zeros(2)}}, ckpt, _use_new_zipfile_serialization=False)
    files = [str(p) for p in (lokr, pth, base, ckpt)]
    code = (
        "import contextlib, io, sys\n"
        "from engine.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    codes = [main(['inspect', *{files!r}, '--json', '--read-values']),\n"
        f"             main(['lora', 'inspect', {str(lokr)!r}, '--base', {str(base)!r}, '--json']),\n"
        f"             main(['scan', {str(tmp_path / 'models')!r}, '--json'])]\n"
        "print(codes, 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "LOADOUT_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[0, 0, 0] False", r.stdout + r.stderr
