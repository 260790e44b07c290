"""The main window: docks (Library, Inspector, Decode, LoRA stack, Loaded + layer map, memory graph)
the user can arrange (the layout is saved), a toolbar (Load, Unload, Unload all, Stop, Settings), a
non-modal message bar, and a status bar with the device, VRAM state, free memory and the current job.
Everything engine-side goes through app.bridge.EngineClient; the GUI thread never imports torch."""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
from pathlib import Path

from PySide6.QtCore import QByteArray, Qt, QTimer, Slot
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QGuiApplication,
    QIcon,
    QKeySequence,
)
from PySide6.QtWidgets import QDockWidget, QLabel, QMainWindow, QProgressBar, QToolBar, QWidget

from app import settings as app_settings
from app.bridge import EngineClient, Job
from app.excepthooks import CrashReporter, ErrorInfo
from app.models.library_model import ENTRY_ROLE
from app.widgets.inspector import InspectorPanel
from app.widgets.library import LibraryPanel
from app.widgets.loaded import LoadedPanel
from app.widgets.lora_stack import LoraStackPanel
from app.widgets.messages import MessageBar
from app.widgets.vram_graph import VramGraph
from engine import memory
from engine.devices import DeviceOptions
from engine.formatting import human_bytes
from engine.jobs import Progress
from engine.requests import (
    Bake,
    Configure,
    DetectDevices,
    HashFiles,
    Load,
    LoraCoverage,
    Pin,
    Scan,
    SetLoras,
    Unload,
    UnloadAll,
)

log = logging.getLogger("loadout.app")
# Icons live in the repository's top-level resources/ (a PyInstaller build puts them beside the code).
RESOURCES = Path(getattr(sys, "_MEIPASS", Path(__file__).resolve().parents[1])) / "resources"
STATUS_INTERVAL_S = 0.5  # the status bar's memory text changes at most twice a second
LOADABLE = ("checkpoint", "diffusion_model", "vae", "vae_approx", "text_encoder")
LAYOUT_VERSION = 1


def app_icon() -> QIcon:
    icon = QIcon()
    for n in (16, 24, 32, 48, 64, 128, 256):
        p = RESOURCES / f"loadout-{n}.png"
        if p.exists():
            icon.addFile(str(p))
    return icon


def _job_text(job: Job) -> str:
    r = job.request
    name = os.path.basename(getattr(r, "path", "") or getattr(r, "base", "") or getattr(r, "lora", ""))
    labels = {"DetectDevices": "Detecting devices", "Scan": "Scanning the library", "HashFiles": "Hashing",
              "Load": f"Loading {name}", "Unload": f"Unloading {getattr(r, 'component', '')}",
              "UnloadAll": "Unloading everything", "Pin": "Pinning", "LoraCoverage": f"Coverage of {name}",
              "SetLoras": "Applying LoRAs", "Bake": "Baking", "Decode": "Decoding", "Encode": "Encoding",
              "Configure": "Applying device options"}  # fmt: skip
    return labels.get(job.name, job.name)


_frozen = False


def _freeze_startup_objects() -> None:
    """Once torch is imported (first device detection), move the ~200k objects of startup out of the
    collector's reach: a full collection (Python's own, or one the engine asks for) then scans only
    what came after — a few ms instead of ~0.2 s with the GIL held, while the window cannot paint or
    react. Once per process: later objects stay collectable (cyclic garbage of frozen ones would not)."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()


class MainWindow(QMainWindow):
    def __init__(
        self,
        options: DeviceOptions | None = None,
        paths: list[str] | None = None,
        client: EngineClient | None = None,
        *,
        restore_layout: bool = True,
    ) -> None:
        super().__init__()
        self.setWindowTitle("Loadout")
        self.setWindowIcon(app_icon())
        self.resize(1500, 920)
        screen = QGuiApplication.primaryScreen()
        if screen is not None:  # never open larger than the screen (a laptop, a 1280×800 VM)
            avail = screen.availableGeometry()
            self.resize(min(1500, avail.width()), min(920, avail.height()))
        self.setAcceptDrops(True)
        self.setDockNestingEnabled(True)
        self.options = options or DeviceOptions()
        self.paths: list[str] = []  # library roots (saved folders, dropped or given paths)
        self.select_after_scan: str | None = None
        self.report = None  # engine.devices.DeviceReport once detected
        self.reporter = CrashReporter(self)
        self.client = client or EngineClient(self)
        self.client.devices_detected.connect(self._on_devices_detected)
        self.client.job_started.connect(self._on_job_started)
        self.client.job_progress.connect(self._on_job_progress)
        self.client.finished.connect(self._on_job_finished)
        self.client.job_failed.connect(self._on_job_failed)
        self.client.job_cancelled.connect(self._on_job_cancelled)
        self.client.event.connect(self._on_engine_event)
        self.client.idle.connect(self._on_idle)

        self.messages = MessageBar()
        self.message_bar = QToolBar("Messages", self)
        self.message_bar.setObjectName("toolbar-messages")
        self.message_bar.setMovable(False)
        self.message_bar.addWidget(self.messages)
        self.messages.visibility_changed.connect(self.message_bar.setVisible)
        self.message_bar.toggleViewAction().setVisible(False)

        self.library = LibraryPanel()
        self.inspector = InspectorPanel()
        self.loaded = LoadedPanel()
        self.stack = LoraStackPanel()
        self.graph = VramGraph()
        self.decode = self._make_decode_panel()
        self.docks: dict[str, QDockWidget] = {}
        self._build_docks()
        self._build_toolbar()
        self._build_status_bar()
        self._connect_panels()

        self.sample_timer = QTimer(self)
        self.sample_timer.setInterval(round(1000 / app_settings.sample_rate_hz()))
        self.sample_timer.timeout.connect(self._on_sample)
        self._last_status = 0.0
        self._loaded_dirty = False
        if restore_layout:
            self.restore_layout()
        self.add_paths(paths or [], persist=False, select_first=bool(paths))

    # -- building --------------------------------------------------------------------------------------

    def _make_decode_panel(self) -> QWidget:
        try:
            from app.widgets.decode import DecodePanel
        except ImportError:  # engine.vae has not landed: say so instead of a dead panel
            w = QLabel(
                "VAE decode arrives with the engine's VAE module.", alignment=Qt.AlignmentFlag.AlignCenter
            )
            w.setStyleSheet("color: gray")
            return w
        return DecodePanel()

    def _dock(self, key: str, title: str, widget: QWidget, area) -> QDockWidget:
        d = QDockWidget(title, self)
        d.setObjectName(f"dock-{key}")  # saveState() needs stable names
        d.setWidget(widget)
        d.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable
                      | QDockWidget.DockWidgetFeature.DockWidgetFloatable
                      | QDockWidget.DockWidgetFeature.DockWidgetClosable)  # fmt: skip
        self.addDockWidget(area, d)
        self.docks[key] = d
        return d

    def _build_docks(self) -> None:
        L, R, B = (
            Qt.DockWidgetArea.LeftDockWidgetArea,
            Qt.DockWidgetArea.RightDockWidgetArea,
            Qt.DockWidgetArea.BottomDockWidgetArea,
        )
        lib = self._dock("library", "Library", self.library, L)
        ins = self._dock("inspector", "Inspector", self.inspector, R)
        dec = self._dock("decode", "Decode", self.decode, R)
        stk = self._dock("stack", "LoRA stack", self.stack, R)
        loaded = self._dock("loaded", "Loaded", self.loaded, B)
        graph = self._dock("graph", "Memory", self.graph, B)
        self.splitDockWidget(ins, stk, Qt.Orientation.Horizontal)
        self.tabifyDockWidget(ins, dec)
        ins.raise_()
        self.splitDockWidget(loaded, graph, Qt.Orientation.Horizontal)
        # Shares of the window, not pixels: the library's columns need the most room, on a 1280-px
        # laptop screen as on a 2560-px one.
        w, h = self.width(), self.height()
        self.resizeDocks(
            [lib, ins, stk], [int(w * 0.44), int(w * 0.29), int(w * 0.27)], Qt.Orientation.Horizontal
        )
        self.resizeDocks([lib, loaded], [int(h * 0.6), int(h * 0.4)], Qt.Orientation.Vertical)
        self.resizeDocks([loaded, graph], [int(w * 0.47), int(w * 0.53)], Qt.Orientation.Horizontal)

    def _build_toolbar(self) -> None:
        tb = QToolBar("Main", self)
        tb.setObjectName("toolbar-main")
        tb.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.addToolBar(tb)
        self.addToolBarBreak()
        self.addToolBar(self.message_bar)
        self.message_bar.hide()
        self.load_action = QAction("Load", self, shortcut=QKeySequence("Ctrl+L"))
        self.load_action.setToolTip("Load the file selected in the library onto the device")
        self.unload_action = QAction("Unload", self)
        self.unload_action.setToolTip(
            "Unload the component selected in Loaded (or the library file's components)"
        )
        self.unload_all_action = QAction("Unload all", self)
        self.stop_action = QAction("■ Stop", self, shortcut=QKeySequence("Esc"))
        self.stop_action.setToolTip(
            "Interrupt whatever the engine is doing (scan, hash, load, patch, decode)"
        )
        self.stop_action.setEnabled(False)
        self.settings_action = QAction("⚙ Settings", self)
        self.load_action.triggered.connect(self._on_load_triggered)
        self.unload_action.triggered.connect(self._on_unload_triggered)
        self.unload_all_action.triggered.connect(lambda: self.submit(UnloadAll()))
        self.stop_action.triggered.connect(self._on_stop_triggered)
        self.settings_action.triggered.connect(self._on_settings_triggered)
        for a in (self.load_action, self.unload_action, self.unload_all_action):
            tb.addAction(a)
        tb.addSeparator()
        tb.addAction(self.stop_action)
        tb.addSeparator()
        tb.addAction(self.settings_action)
        view = tb.addAction("Panels")
        view.setToolTip("Show or hide panels")
        view.triggered.connect(self._on_panels_triggered)

    def _build_status_bar(self) -> None:
        self.device_label = QLabel("Detecting devices\u2026")
        self.state_label = QLabel("")
        self.memory_label = QLabel("")
        self.job_label = QLabel("")
        self.job_bar = QProgressBar()
        self.job_bar.setMaximumWidth(180)
        self.job_bar.setMaximumHeight(14)
        self.job_bar.hide()
        bar = self.statusBar()
        bar.addWidget(self.job_label)
        bar.addWidget(self.job_bar)
        for w in (self.device_label, self.state_label, self.memory_label):
            w.setContentsMargins(8, 0, 8, 0)
            bar.addPermanentWidget(w)

    def _connect_panels(self) -> None:
        self.library.selected.connect(self._on_library_selected)
        self.library.load_requested.connect(self._on_library_load)
        self.library.add_to_stack_requested.connect(lambda e: self.stack.add(e.path))
        self.library.message.connect(self.notify)
        self.loaded.unload_requested.connect(lambda p, n: self.submit(Unload(p, n)))
        self.loaded.free_requested.connect(lambda p, n, b: self.submit(Unload(p, n, b)))
        self.loaded.pin_requested.connect(lambda p, n, on: self.submit(Pin(p, n, on)))
        self.stack.coverage_requested.connect(lambda lora, base: self.submit(LoraCoverage(lora, base)))
        self.stack.apply_requested.connect(lambda base, st: self.submit(SetLoras(base, st)))
        self.stack.bake_requested.connect(lambda base, st, out: self.submit(Bake(base, st, out)))
        self.stack.files_dropped.connect(self._on_stack_files_dropped)
        self.stack.message.connect(self.notify)
        self.graph.exported.connect(lambda p: self.notify(f"Saved {p}"))
        if hasattr(self.decode, "connect_window"):
            self.decode.connect_window(self)

    # -- layout ------------------------------------------------------------------------------------------

    def restore_layout(self) -> bool:
        s = app_settings.settings()
        geo, state = s.value("window/geometry"), s.value("window/state")
        ok = False
        if isinstance(geo, QByteArray):
            self.restoreGeometry(geo)
        if isinstance(state, QByteArray):
            ok = self.restoreState(state, LAYOUT_VERSION)
        return ok

    def save_layout(self) -> None:
        s = app_settings.settings()
        s.setValue("window/geometry", self.saveGeometry())
        s.setValue("window/state", self.saveState(LAYOUT_VERSION))
        s.sync()

    # -- life cycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin sampling, detect devices (torch is imported there), then scan the saved library."""
        self._on_sample()
        self.sample_timer.start()
        self.client.detect_devices(self.options)
        saved = [p for p in app_settings.library_folders() if os.path.exists(p) and p not in self.paths]
        self.add_paths(saved, persist=False, select_first=False)
        if self.offer_first_run and not self.paths:
            QTimer.singleShot(0, self._on_first_run)

    offer_first_run = False  # set by app.main.run() only: tests and `loadout FILE` never see the dialog

    @Slot()
    def _on_first_run(self) -> None:
        """First start with no library: offer the installs found on this machine, or the demo library
        (asked once; the answer is remembered in the settings file)."""
        from app.first_run import maybe_first_run

        paths = maybe_first_run(self, app_settings.settings())
        if paths:
            self.add_paths([str(p) for p in paths])
            self._offer_demo_latent(paths)

    def _offer_demo_latent(self, paths) -> None:
        """Opening the demo library: its latent goes into Decode (the VAE is chosen as the library
        fills), so the first Decode press shows a picture."""
        from engine.catalog.demo import DEMO_LATENT

        for p in paths:
            latent = os.path.join(str(p), DEMO_LATENT)
            if os.path.isfile(latent) and hasattr(self.decode, "set_input"):
                self.decode.set_input(latent)
                return

    def closeEvent(self, event: QCloseEvent) -> None:
        self.sample_timer.stop()
        self.save_layout()
        for d in list(self.reporter.dialogs):  # dialogs are windows of their own: they go with us
            d.close()
        self.client.shutdown()
        super().closeEvent(event)

    def submit(self, request) -> int:
        return self.client.submit(request)

    def notify(self, text: str, level: str = "info") -> None:
        """A non-modal message (never a dialog): errors the user can act on and notices."""
        log.log(logging.WARNING if level != "info" else logging.INFO, "%s", text)
        self.messages.show_message(text, level)

    # -- library: paths, drops, selection ----------------------------------------------------------------

    def add_paths(self, paths: list[str], *, persist: bool = True, select_first: bool = True,
                  scan: bool = True) -> list[str]:  # fmt: skip
        """Add files/folders to the library and scan them; `select_first` selects the first file
        (`loadout FILE`, a double-click, a dropped file) and shows its inspector."""
        new, missing = [], []
        for p in paths:
            p = os.path.abspath(p)
            if not os.path.exists(p):
                missing.append(p)
                continue
            if p not in self.paths:
                self.paths.append(p)
            new.append(p)
        if missing:
            self.notify(f"Not found: {', '.join(missing)}", "warning")
        if persist and new:
            saved = app_settings.library_folders()
            app_settings.set_library_folders(saved + [p for p in new if p not in saved])
        first = next((p for p in new if os.path.isfile(p)), None)
        if select_first and first:
            self.select_after_scan = first
        if scan and new:
            self.submit(Scan(tuple(new)))
        return new

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if any(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        urls = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        if not urls:
            self.notify("Only files and folders can be dropped here.", "warning")
            return
        if hasattr(self.decode, "set_input") and all(
            p.lower().endswith((".latent", ".png", ".jpg", ".jpeg", ".webp")) for p in urls
        ):
            if self.decode.set_input(urls[0]):  # a latent or an image is Decode's input, not a model
                self.docks["decode"].raise_()
            event.acceptProposedAction()
            return
        self.add_paths(urls)
        event.acceptProposedAction()

    @Slot(object)
    def _on_library_selected(self, entry) -> None:
        self.inspector.show_entry(entry, self.library.model.sha256(entry))
        self.docks["inspector"].raise_()
        if entry.kind in ("checkpoint", "diffusion_model") and not entry.error:
            self.stack.set_base(entry.path)

    @Slot(object)
    def _on_library_load(self, entry) -> None:
        if entry is None:
            return
        if entry.error:
            self.notify(f"{entry.name} cannot be loaded: {entry.error.message}", "error")
        elif entry.kind == "lora":
            self.stack.add(entry.path)
            self.docks["stack"].raise_()
        elif entry.kind not in LOADABLE:
            self.notify(f"{entry.name} is a {entry.kind}: Loadout loads checkpoints, diffusion models, "
                        "text encoders and VAEs.", "warning")  # fmt: skip
        else:
            self.submit(Load(entry.path))

    @Slot(list)
    def _on_stack_files_dropped(self, paths: list[str]) -> None:
        known = {e.path: e for e in self.library.model.entries}
        todo = []
        for p in map(os.path.abspath, paths):
            e = known.get(p)
            if e is None:
                todo.append(p)
            elif e.kind == "lora":
                self.stack.add(p)
            else:
                self.notify(f"{e.name} is a {e.kind}, not a LoRA: it was not added to the stack.", "warning")
        if todo:
            self._stack_pending = set(todo)
            self.add_paths(todo, select_first=False)

    # -- toolbar -----------------------------------------------------------------------------------------

    @Slot()
    def _on_load_triggered(self) -> None:
        e = self.library.current_entry()
        if e is None:
            self.notify(
                "Select a checkpoint, diffusion model, text encoder or VAE in the library first.", "warning"
            )
            return
        self._on_library_load(e)

    @Slot()
    def _on_unload_triggered(self) -> None:
        key = self.loaded.selected()
        if key is not None:
            self.submit(Unload(*key))
            return
        self.notify("Select a component in Loaded to unload it.", "warning")

    @Slot()
    def _on_stop_triggered(self) -> None:
        n = self.client.cancel_all("Stopped by the user.")
        if n:
            self.job_label.setText("Stopping\u2026")

    @Slot()
    def _on_settings_triggered(self) -> None:
        from app.settings_dialog import SettingsDialog

        snap = self.client.engine.snapshot()
        dlg = SettingsDialog(self, options=self.options, loaded=len(snap.components) if snap else 0)
        dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dlg.accepted.connect(lambda: self._apply_settings(dlg))
        self.settings_dialog = dlg
        dlg.open()

    def _apply_settings(self, dlg) -> None:
        """Apply what Settings saved, now: the sample rate, the library folders (rescanned) and the
        device options (the engine re-detects and rebuilds its budget; see engine.facade.configure)."""
        self.sample_timer.setInterval(round(1000 / app_settings.sample_rate_hz()))
        folders = [os.path.abspath(p) for p in dlg.folders()]
        removed = [p for p in self.paths if os.path.isdir(p) and p not in folders]
        if removed:
            self.paths = [p for p in self.paths if p not in removed]
            self.library.remove_under(removed)
        if removed or any(p not in self.paths for p in folders):
            self.add_paths(folders, persist=False, select_first=False)  # a rescan; the cache keeps it quick
        options = dlg.device_options()
        if options != self.options:
            self.options = options
            self.submit(Configure(options))
        else:
            self.notify("Settings saved.")

    def _on_configured(self, result) -> None:
        self._on_devices_detected(result.report)
        self.loaded.set_snapshot(result.snapshot)
        self._forget_patches()
        text = "Device options applied"
        if result.unloaded:
            text += f"; unloaded {', '.join(result.unloaded)}"
        if result.evicted_bytes:
            text += f"; {human_bytes(result.evicted_bytes)} offloaded to fit the new budget"
        self.notify(text + ".")

    @Slot()
    def _on_panels_triggered(self) -> None:
        menu = self.createPopupMenu()
        menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        menu.popup(self.cursor().pos())

    # -- engine results ----------------------------------------------------------------------------------

    @Slot(object)
    def _on_devices_detected(self, report) -> None:
        self.report = report
        _freeze_startup_objects()
        d = report.selected
        log.info("device %s (%s), VRAM state %s", d.torch_device, d.name, report.vram_state.value)
        self.device_label.setText(
            f"Device: {d.name} ({d.torch_device})" if d.kind != "cpu" else f"Device: CPU ({d.name})"
        )
        self.device_label.setToolTip("\n".join(f"{x.torch_device}: {x.name}" for x in report.devices))
        cap = report.vram_budget_bytes
        self.state_label.setText(
            f"VRAM state: {report.vram_state.value}"
            + (f" · cap {human_bytes(cap)}" if cap is not None else "")
        )
        self.state_label.setToolTip(
            f"CPU state {report.cpu_state.value}. Reserved {human_bytes(report.reserve_bytes)}, minimum "
            f"inference memory {human_bytes(report.min_inference_bytes)}; VAE on {report.vae_device}"
        )
        self._last_status = 0.0
        self._on_sample()

    @Slot(object)
    def _on_job_started(self, job: Job) -> None:
        self.stop_action.setEnabled(True)
        if self.client.current is job or len(self.client.jobs) == 1:
            self._show_job(job, None)

    def _show_job(self, job: Job, p: Progress | None) -> None:
        text = _job_text(job)
        if p is not None and p.total:
            frac = p.done / p.total
            elapsed = time.monotonic() - job.started
            eta = f" · {elapsed / frac - elapsed:.0f} s left" if 0.05 < frac < 1 and elapsed > 1 else ""
            count = f"{100 * frac:.0f} %" if p.total > 10_000 else f"{p.done}/{p.total}"
            text += f" · {p.stage} {count}{eta}" if p.stage not in text else f" {count}{eta}"
            self.job_bar.setRange(0, 1000)
            self.job_bar.setValue(round(1000 * frac))
        else:
            if p is not None and p.stage:
                text += f" · {p.stage}"
            self.job_bar.setRange(0, 0)
        queued = len(self.client.jobs) - 1
        if queued > 0:
            text += f" (+{queued} queued)"
        self.job_label.setText(text)
        self.job_bar.show()

    @Slot(object, object)
    def _on_job_progress(self, job: Job, p: Progress) -> None:
        self._show_job(job, p)
        if job.name in ("Scan", "HashFiles"):
            self.library.set_progress(p.stage, p.done, p.total)
        if hasattr(self.decode, "on_progress"):
            self.decode.on_progress(job, p)

    def _next_job(self) -> None:
        cur = self.client.current
        if cur is not None:
            self._show_job(cur, None)

    @Slot(object, object)
    def _on_job_finished(self, job: Job, result) -> None:
        self._next_job()
        name = job.name
        if name == "Scan":
            self._on_scanned(result)
        elif name == "HashFiles":
            for path, sha in result.hashed:
                self.library.model.set_hash(path, sha)
            e = self.inspector.entry
            if e is not None and self.library.model.sha256(e):
                self.inspector.show_entry(e, self.library.model.sha256(e))
            self.library.hide_progress()
            if result.failed:
                self.notify(f"Could not hash {len(result.failed)} file(s): {result.failed[0][1]}", "warning")
        elif name in ("Load", "Unload", "UnloadAll", "Pin"):
            self.loaded.set_snapshot(result.snapshot)
            if name == "Load":
                self.notify(f"{result.message}: {human_bytes(result.bytes)} placed on the device.")
            elif name == "Unload":
                self.notify(f"{result.message}: {human_bytes(result.bytes)} released.")
            if name in ("Unload", "UnloadAll"):
                self._forget_patches()
        elif name == "Configure":
            self._on_configured(result)
        elif name == "LoraCoverage":
            self.stack.set_coverage(result.lora, result.base, result.coverage)
        elif name == "SetLoras":
            for c in result.coverages:
                self.stack.set_coverage(c.lora, c.base, c.coverage)
            self.stack.set_applied(result.stack, result.patched)
            self.loaded.set_patched(result.base, result.patched_units)
        elif name == "Bake":
            self.notify(
                f"Baked {os.path.basename(result.out)} ({human_bytes(result.bytes)}); it joins the library."
            )
            self.add_paths([result.out], select_first=True)
        elif hasattr(self.decode, "on_finished"):
            self.decode.on_finished(job, result)

    def _forget_patches(self) -> None:
        snap = self.client.engine.snapshot()
        loaded = {c.path for c in snap.components} if snap else set()
        for base in {k[0] for k in self.loaded.patched}:
            if base not in loaded:
                self.loaded.set_patched(base, {})
                if self.stack.base() == base:
                    self.stack.set_applied((), 0)

    def _on_scanned(self, lib) -> None:
        added = self.library.merge(lib.entries)
        self.library.hide_progress()
        self.stack.set_bases(self.library.model.entries)
        if hasattr(self.decode, "set_library"):
            self.decode.set_library(self.library.model.entries)
        pending = getattr(self, "_stack_pending", set())
        for e in lib.entries:
            if e.path in pending:
                pending.discard(e.path)
                if e.kind == "lora":
                    self.stack.add(e.path)
                else:
                    self.notify(
                        f"{e.name} is a {e.kind}, not a LoRA: it was not added to the stack.", "warning"
                    )
        bad = [e for e in lib.entries if e.error and e.error.type != "unsupported"]
        for e in bad[:1]:
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            self.notify(f"{e.name}: {e.error.message}{more}", "error")
        if not lib.entries and not bad:
            roots = ", ".join(os.path.basename(r.path) for r in lib.roots)
            self.notify(f"No model files found in {roots}. Loadout reads .safetensors, .ckpt, .pt, .pth, .bin "
                        "and .gguf files and folders of them.", "warning")  # fmt: skip
        elif added:
            self.statusBar().showMessage(f"{len(added)} file(s) added to the library", 4000)
        target = self.select_after_scan
        if not target and self.library.current_entry() is None and lib.entries:
            # Nothing chosen yet: show the first file (sorted as the user sees it) so the Inspector
            # explains something on first sight instead of an empty pane.
            first = self.library.proxy.index(0, 0).data(ENTRY_ROLE)
            target = first.path if first is not None else None
        if target and any(e.path == target for e in lib.entries):
            self.select_after_scan = None
            self.library.select_path(target)
            e = self.library.current_entry()
            if e is not None:
                self._on_library_selected(e)
        items = tuple((e.path, e.size, e.mtime_ns) for e in lib.entries
                      if not e.sha256 and not e.is_dir and not e.error and e.path not in self.library.model.hashes)  # fmt: skip
        if items:
            self.submit(HashFiles(items))

    @Slot(object, object)
    def _on_job_failed(self, job: Job, info: ErrorInfo) -> None:
        self._next_job()
        if isinstance(job.request, DetectDevices):
            self.device_label.setText("Device detection failed")
            self.reporter.report.emit(info)  # nothing works without a device: a dialog is right here
        elif info.expected:
            self.notify(info.message, "error")
        else:
            self.reporter.report.emit(info)
        if job.name == "LoraCoverage":
            self.stack.set_coverage_error(job.request.lora, info.message)
        if hasattr(self.decode, "on_failed"):
            self.decode.on_failed(job, info)

    @Slot(object)
    def _on_job_cancelled(self, job: Job) -> None:
        self._next_job()
        self.notify(f"{_job_text(job)}: stopped; nothing was left half done.", "info")
        if job.name in ("Scan", "HashFiles"):
            self.library.hide_progress()
        if hasattr(self.decode, "on_cancelled"):
            self.decode.on_cancelled(job)
        self._refresh_loaded()

    @Slot()
    def _on_idle(self) -> None:
        self.stop_action.setEnabled(False)
        self.job_label.setText("")
        self.job_bar.hide()

    @Slot(object)
    def _on_engine_event(self, event) -> None:
        self.graph.add_event(event)
        if hasattr(self.decode, "on_event"):
            self.decode.on_event(event)
        self._loaded_dirty = True

    def _refresh_loaded(self) -> None:
        snap = self.client.engine.snapshot()
        if snap is not None and snap is not self.loaded.snapshot:
            self.loaded.set_snapshot(snap)

    # -- sampler ---------------------------------------------------------------------------------------

    @Slot()
    def _on_sample(self) -> None:
        s = memory.sample()
        self.graph.add_sample(s)
        if hasattr(self.decode, "set_free_bytes"):
            self.decode.set_free_bytes(s.device_free)
        now = time.monotonic()
        if self._loaded_dirty or (self.client.busy and now - self._last_status >= STATUS_INTERVAL_S):
            self._loaded_dirty = False
            self._refresh_loaded()
        if now - self._last_status < STATUS_INTERVAL_S:
            return
        self._last_status = now
        what = "RAM" if s.device_is_ram else "VRAM"
        text = f"{what} free {human_bytes(s.device_free)} of {human_bytes(s.device_total)}"
        if self.report is not None:
            budget = self.report.budget_bytes(s.device_free)
            text += f" \u00b7 weight budget {human_bytes(budget)}"
        self.memory_label.setText(text)
        tip = [f"{s.device_label}: {human_bytes(s.device_used)} used ({s.device_source})",
               f"Process RSS {human_bytes(s.process_rss)}",
               f"System RAM {human_bytes(s.ram_available)} available of {human_bytes(s.ram_total)}"]  # fmt: skip
        if s.torch_allocated is not None:
            tip.append(
                f"torch allocated {human_bytes(s.torch_allocated)}, reserved {human_bytes(s.torch_reserved)}"
            )
        self.memory_label.setToolTip("\n".join(tip))
