"""The main window: docks (Library, Inspector, Decode, LoRA stack, Loaded + layer map, memory graph)
the user can arrange (the layout is saved), a toolbar (Load, Unload, Unload all, Stop, Settings), a
non-modal message bar, and a status bar (the job: app.job_status; the device and memory:
app.device_status). Each panel sends its own requests through app.bridge.EngineClient and shows their
results; the window passes on what one panel tells another, and is the one path by which errors and
notices reach the user. The GUI thread never imports torch."""

from __future__ import annotations

import logging
import os
import sys
from functools import partial
from pathlib import Path

from PySide6.QtCore import QByteArray, Qt, Slot
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QGuiApplication,
    QIcon,
    QKeySequence,
)
from PySide6.QtWidgets import QDockWidget, QMainWindow, QToolBar, QWidget

from app import settings as app_settings
from app.bridge import EngineClient
from app.device_status import DeviceStatus
from app.excepthooks import CrashReporter, ErrorInfo
from app.first_run import FirstRun
from app.job_status import JobStatus
from app.widgets.decode import DecodePanel
from app.widgets.decode_inputs import CLIP_SUFFIXES, IMAGE_SUFFIXES, SOUND_SUFFIXES, holds_a_latent
from app.widgets.inspector import InspectorPanel
from app.widgets.library import LibraryPanel
from app.widgets.loaded import LoadedPanel
from app.widgets.lora_stack import LoraStackPanel
from app.widgets.messages import MessageBar
from app.widgets.vram_graph import VramGraph
from engine.devices import DeviceOptions

log = logging.getLogger("loadout.app")
# Icons live in the repository's top-level resources/ (a PyInstaller build puts them beside the code).
RESOURCES = Path(getattr(sys, "_MEIPASS", Path(__file__).resolve().parents[1])) / "resources"
# dropped alone, these go to Decode: latents, images, and clips to encode (a dropped folder is a model folder)
DECODE_INPUTS = (".latent", *IMAGE_SUFFIXES, *CLIP_SUFFIXES, *SOUND_SUFFIXES)
LAYOUT_VERSION = 1


def app_icon() -> QIcon:
    icon = QIcon()
    for n in (16, 24, 32, 48, 64, 128, 256):
        p = RESOURCES / f"loadout-{n}.png"
        if p.exists():
            icon.addFile(str(p))
    return icon


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
        self.reporter = CrashReporter(self)
        self.client = client or EngineClient(self)
        self.client.error.connect(self._on_error)

        self.messages = MessageBar()
        self.message_bar = self.messages.toolbar(self)

        self.library = LibraryPanel()
        self.inspector = InspectorPanel()
        self.loaded = LoadedPanel()
        self.stack = LoraStackPanel()
        self.graph = VramGraph()
        self.decode = DecodePanel()
        for panel in (self.library, self.loaded, self.stack, self.decode):
            panel.attach(self.client)
        self.docks: dict[str, QDockWidget] = {}
        self._build_docks()
        self._build_toolbar()
        self.jobs = JobStatus(self.client, self.statusBar(), self.stop_action)
        self.device_status = DeviceStatus(self.client, self.statusBar(), self.reporter,
                                          options or DeviceOptions(), app_settings.sample_rate_hz())  # fmt: skip
        self.first_run = FirstRun(self, self.client)
        self._connect_panels()
        if restore_layout:
            self.restore_layout()
        self.library.add_paths(paths or [], persist=False, select_first=bool(paths))

    # -- building --------------------------------------------------------------------------------------

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
        self.stop_action = QAction("■ Stop", self, shortcut=QKeySequence("Esc"))  # app.job_status runs it
        self.stop_action.setToolTip(
            "Interrupt whatever the engine is doing (scan, hash, load, patch, decode)"
        )
        self.settings_action = QAction("⚙ Settings", self)
        self.load_action.triggered.connect(self.library.load_current)
        self.unload_action.triggered.connect(self._on_unload_triggered)
        self.unload_all_action.triggered.connect(self.loaded.unload_all)
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

    def _connect_panels(self) -> None:
        """What one panel tells another, and every panel's notices for the message bar."""
        lib, stack, loaded = self.library, self.stack, self.loaded
        lib.selected.connect(self._on_library_selected)
        lib.load_file.connect(loaded.load)
        lib.lora_opened.connect(self._on_lora_opened)
        lib.add_to_stack_requested.connect(self._on_add_to_stack)
        lib.entries_changed.connect(stack.on_library_changed)
        lib.entries_changed.connect(self.decode.set_library)
        lib.entries_changed.connect(loaded.set_library)
        lib.hashed.connect(self._on_hashed)
        lib.status.connect(self._on_status)
        stack.files_to_scan.connect(partial(lib.add_paths, select_first=False))
        stack.patches_changed.connect(loaded.set_patched)
        stack.baked.connect(self._on_baked)
        loaded.patches_dropped.connect(stack.on_base_unloaded)
        self.client.event.connect(self.graph.add_event)
        self.device_status.sampled.connect(self._on_sampled)
        self.device_status.configured.connect(loaded.on_configured)
        self.first_run.chosen.connect(lib.add_paths)
        self.first_run.demo_latent.connect(self.decode.set_input)
        self.graph.exported.connect(self._on_exported)
        for source in (lib.message, stack.message, loaded.message, self.decode.message, self.jobs.notice,
                       self.device_status.notice):  # fmt: skip
            source.connect(self.notify)

    # -- layout ------------------------------------------------------------------------------------------

    def restore_layout(self) -> bool:
        s = app_settings.settings()
        geo, state = s.value("window/geometry"), s.value("window/state")
        ok = False
        if isinstance(geo, QByteArray):
            self.restoreGeometry(geo)
        if isinstance(state, QByteArray):
            ok = self.restoreState(state, LAYOUT_VERSION)
        self.message_bar.setVisible(self.messages.shown)  # not as saved: a message of a session before
        return ok

    def save_layout(self) -> None:
        s = app_settings.settings()
        s.setValue("window/geometry", self.saveGeometry())
        s.setValue("window/state", self.saveState(LAYOUT_VERSION))
        s.sync()

    # -- life cycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin sampling, detect devices (torch is imported there), then scan the saved library."""
        self.device_status.start()
        self.library.add_paths(self.library.roots.saved(), persist=False, select_first=False)
        if self.offer_first_run and not self.library.roots.paths:
            self.first_run.start()

    offer_first_run = False  # set by app.main.run() only: tests and `loadout FILE` never see the dialog

    def closeEvent(self, event: QCloseEvent) -> None:
        self.device_status.stop()
        self.save_layout()
        for d in list(self.reporter.dialogs):  # dialogs are windows of their own: they go with us
            d.close()
        self.client.shutdown()
        super().closeEvent(event)

    # -- the user's one path for messages and errors -----------------------------------------------------

    def notify(self, text: str, level: str = "info") -> None:
        """A non-modal message (never a dialog): errors the user can act on and notices."""
        log.log(logging.WARNING if level != "info" else logging.INFO, "%s", text)
        self.messages.show_message(text, level)

    @Slot(object)
    def _on_error(self, info: ErrorInfo) -> None:
        """A failed job: an expected error is a message; a bug opens the crash dialog."""
        if info.expected:
            self.notify(info.message, "error")
        else:
            self.reporter.report.emit(info)

    @Slot(str)
    def _on_status(self, text: str) -> None:
        self.statusBar().showMessage(text, 4000)

    @Slot(str)
    def _on_exported(self, path: str) -> None:
        self.notify(f"Saved {path}")

    # -- drops and what panels tell each other ----------------------------------------------------------

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if any(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        urls = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        if not urls:
            self.notify("Only files and folders can be dropped here.", "warning")
            return
        if all(p.lower().endswith(DECODE_INPUTS) or holds_a_latent(p) for p in urls):
            if self.decode.set_input(urls[0]):  # a latent or an image is Decode's input, not a model
                self.docks["decode"].raise_()
        else:
            self.library.add_paths(urls)
        event.acceptProposedAction()

    @Slot(object)
    def _on_sampled(self, s) -> None:
        self.graph.add_sample(s)
        self.decode.set_free_bytes(s.device_free)
        self.loaded.on_sample(s)

    @Slot(object)
    def _on_library_selected(self, entry) -> None:
        self.inspector.show_entry(entry, self.library.model.sha256(entry))
        self.docks["inspector"].raise_()
        if entry.kind in ("checkpoint", "diffusion_model") and not entry.error:
            self.stack.set_base(entry.path)

    @Slot()
    def _on_hashed(self) -> None:
        e = self.inspector.entry
        if e is not None and self.library.model.sha256(e):
            self.inspector.show_entry(e, self.library.model.sha256(e))

    @Slot(str)
    def _on_lora_opened(self, path: str) -> None:
        self.stack.add(path)
        self.docks["stack"].raise_()

    @Slot(object)
    def _on_add_to_stack(self, entry) -> None:
        self.stack.add(entry.path)

    @Slot(str)
    def _on_baked(self, out: str) -> None:
        self.library.add_paths([out], select_first=True)

    # -- toolbar -----------------------------------------------------------------------------------------

    @Slot()
    def _on_unload_triggered(self) -> None:
        if not self.loaded.unload_selected():
            self.notify("Select a component in Loaded to unload it.", "warning")

    @Slot()
    def _on_settings_triggered(self) -> None:
        from app.settings_dialog import SettingsDialog

        snap = self.client.snapshot()
        loaded = len(snap.components) if snap else 0
        session = self.library.roots.unsaved_folders()
        dlg = SettingsDialog(self, options=self.device_status.options, loaded=loaded, session=session)
        dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dlg.accepted.connect(partial(self._apply_settings, dlg))
        self.settings_dialog = dlg
        dlg.open()

    def _apply_settings(self, dlg) -> None:
        """Apply what Settings saved, now: the sample rate, the library folders (rescanned) and the
        device options (the engine re-detects and rebuilds its budget)."""
        self.device_status.set_rate(app_settings.sample_rate_hz())
        self.library.keep_folders([os.path.abspath(p) for p in dlg.folders()],
                                  [os.path.abspath(p) for p in dlg.listed])  # fmt: skip
        if not self.device_status.configure(dlg.device_options()):
            self.notify("Settings saved.")

    @Slot()
    def _on_panels_triggered(self) -> None:
        menu = self.createPopupMenu()
        menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        menu.popup(self.cursor().pos())
