"""Settings: device options, library folders and the memory graph's sample rate — applied when the user
presses Save (the window sends the engine a Configure request) and saved with app.settings (QSettings
under LOADOUT_CONFIG_DIR) for the next start. Options that change where components are placed unload
them: the dialog says how many first and lets the user cancel."""

from __future__ import annotations

from dataclasses import fields, replace

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app import settings as S
from engine.devices import DTYPE_CHOICES, WEIGHT_DTYPE_CHOICES, DeviceOptions
from engine.requests import unloads_components

VRAM_MODES = (("auto", ""), ("--lowvram", "lowvram"), ("--novram", "novram"), ("--normalvram", "normalvram"),
              ("--highvram", "highvram"), ("--gpu-only", "gpu_only"), ("--cpu", "cpu"))  # fmt: skip
# The dtype flags: (DeviceOptions field, label, choices); "auto" is None (the device rules decide).
DTYPE_FIELDS = (("force_dtype", "Compute dtype", DTYPE_CHOICES),
                ("unet_dtype", "Diffusion model weights", WEIGHT_DTYPE_CHOICES),
                ("text_encoder_dtype", "Text encoder weights", WEIGHT_DTYPE_CHOICES),
                ("vae_dtype", "VAE dtype", DTYPE_CHOICES))  # fmt: skip


def saved_device_options() -> dict:
    """DeviceOptions fields saved in the settings (merged under the command line's flags)."""
    s = S.settings()
    out: dict = {}
    mode = s.value("device/mode", "")
    if mode:
        out[str(mode)] = True
    for key in ("reserve_vram_gb", "vram_budget_gb"):
        v = s.value(f"device/{key}", "")
        try:
            if v not in ("", None) and float(v) > 0:
                out[key] = float(v)
        except (TypeError, ValueError):
            pass
    for key in ("cpu_vae", "disable_smart_memory"):
        if str(s.value(f"device/{key}", "false")).lower() == "true":
            out[key] = True
    for key, _, choices in DTYPE_FIELDS:
        v = s.value(f"device/{key}", "")
        if v in choices:
            out[key] = str(v)
    try:
        index = int(s.value("device/device_index", -1))
    except (TypeError, ValueError):
        index = -1
    if index >= 0:
        out["device_index"] = index
    return out


MODE_FLAGS = tuple(key for _, key in VRAM_MODES if key)


class SettingsDialog(QDialog):
    """`options` are the device options in effect (the command line's flags with the saved ones);
    `loaded` is how many components are loaded now (Save warns before options unload them);
    `session` the library's folders this run only (the command line's: not saved, not in the list)."""

    def __init__(
        self,
        parent: QWidget | None = None,
        *,
        options: DeviceOptions | None = None,
        loaded: int = 0,
        session: list[str] | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Loadout settings")
        self.options = options or DeviceOptions(**saved_device_options())
        self.loaded = loaded
        self.confirm: QMessageBox | None = None
        o = self.options
        dev = QGroupBox("Device (applied when you press Save)")
        form = QFormLayout(dev)
        self.mode = QComboBox()
        for label, key in VRAM_MODES:
            self.mode.addItem(label, key)
        mode = next((k for k in MODE_FLAGS if getattr(o, k)), "")
        self.mode.setCurrentIndex(max(0, self.mode.findData(mode)))
        self.reserve = QDoubleSpinBox(suffix=" GiB", maximum=512, singleStep=0.1, specialValueText="default")
        self.budget = QDoubleSpinBox(
            suffix=" GiB", maximum=4096, singleStep=0.5, decimals=3, specialValueText="no cap"
        )
        self.reserve.setValue(o.reserve_vram_gb or 0)
        self.budget.setValue(o.vram_budget_gb or 0)
        self.cpu_vae = QCheckBox("Run the VAE on the CPU (--cpu-vae)")
        self.cpu_vae.setChecked(o.cpu_vae)
        self.smart = QCheckBox("Unload models eagerly (--disable-smart-memory)")
        self.smart.setChecked(o.disable_smart_memory)
        self.device_index = QSpinBox(minimum=-1, maximum=63, specialValueText="default")
        self.device_index.setToolTip("Which GPU (--device N); default: the first")
        self.device_index.setValue(-1 if o.device_index is None else o.device_index)
        self.dtypes: dict[str, QComboBox] = {}
        for key, _, choices in DTYPE_FIELDS:
            box = QComboBox()
            box.addItem("auto", None)
            for c in choices:
                box.addItem(c, c)
            box.setCurrentIndex(max(0, box.findData(getattr(o, key))))
            self.dtypes[key] = box
        form.addRow("VRAM mode", self.mode)
        form.addRow("Reserve VRAM", self.reserve)
        form.addRow("VRAM budget", self.budget)
        form.addRow("GPU", self.device_index)
        for key, label, _ in DTYPE_FIELDS:
            form.addRow(label, self.dtypes[key])
        form.addRow(self.cpu_vae)
        form.addRow(self.smart)

        lib = QGroupBox("Library folders")
        ll = QVBoxLayout(lib)
        self.list = QListWidget()
        self.listed = S.library_folders()  # as opened: what Save may take out of the library
        self.list.addItems(self.listed)
        add, remove = QPushButton("Add…"), QPushButton("Remove")
        add.clicked.connect(self._on_add_clicked)
        remove.clicked.connect(lambda: self.list.takeItem(self.list.currentRow()))
        row = QHBoxLayout()
        row.addWidget(add)
        row.addWidget(remove)
        row.addStretch(1)
        ll.addWidget(self.list)
        ll.addLayout(row)
        # Folders from the command line are in the library but not saved: say so, or the empty list
        # reads as if the library had none.
        self.session_label = QLabel()
        self.session_label.setWordWrap(True)
        self.session_label.setVisible(bool(session))
        if session:
            self.session_label.setText(
                "Also in the library for this session (given on the command line, not saved): "
                + ", ".join(session)
            )
        ll.addWidget(self.session_label)

        graph = QGroupBox("Memory graph")
        gf = QFormLayout(graph)
        self.rate = QDoubleSpinBox(suffix=" samples/s", minimum=1, maximum=20, decimals=0)
        self.rate.setValue(S.sample_rate_hz())
        gf.addRow("Sample rate", self.rate)

        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self._on_save)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        for w in (dev, lib, graph, buttons):
            lay.addWidget(w)

    def folders(self) -> list[str]:
        return [self.list.item(i).text() for i in range(self.list.count())]

    def _on_add_clicked(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Add a library folder")
        if d and d not in self.folders():
            self.list.addItem(d)

    def device_options(self) -> DeviceOptions:
        """The options in effect with the dialog's device fields (every device flag of the command line)."""
        kw: dict = dict.fromkeys(MODE_FLAGS, False)
        mode = self.mode.currentData()
        if mode:
            kw[mode] = True
        kw["reserve_vram_gb"] = self.reserve.value() or None
        kw["vram_budget_gb"] = self.budget.value() or None
        kw["cpu_vae"] = self.cpu_vae.isChecked()
        kw["disable_smart_memory"] = self.smart.isChecked()
        kw["device_index"] = None if self.device_index.value() < 0 else self.device_index.value()
        for key, box in self.dtypes.items():
            kw[key] = box.currentData()
        names = {f.name for f in fields(DeviceOptions)}
        return replace(self.options, **{k: v for k, v in kw.items() if k in names})

    def unloads(self) -> bool:
        """Whether Save would unload the loaded components (the device or placement rules change)."""
        return self.loaded > 0 and unloads_components(self.options, self.device_options())

    def _on_save(self) -> None:
        if not self.unloads():
            self._save()
            return
        n = self.loaded
        self.confirm = QMessageBox(
            QMessageBox.Icon.Warning,
            "Apply device options",
            f"Applying these options unloads {n} loaded component{'s' if n != 1 else ''}.",
            QMessageBox.StandardButton.Ok | QMessageBox.StandardButton.Cancel,
            self,
        )
        self.confirm.setInformativeText(
            "They were placed for the old device rules; load them again afterwards. Budget and reserve "
            "changes alone keep them loaded."
        )
        self.confirm.button(QMessageBox.StandardButton.Ok).setText("Apply and unload")
        self.confirm.finished.connect(self._on_confirm_finished)
        self.confirm.open()

    def _on_confirm_finished(self, result: int) -> None:
        box, self.confirm = self.confirm, None
        if box is not None:
            box.deleteLater()
        if box is not None and box.standardButton(box.clickedButton()) == QMessageBox.StandardButton.Ok:
            self._save()

    def _save(self) -> None:
        s = S.settings()
        s.setValue("device/mode", self.mode.currentData())
        s.setValue("device/reserve_vram_gb", self.reserve.value())
        s.setValue("device/vram_budget_gb", self.budget.value())
        s.setValue("device/cpu_vae", self.cpu_vae.isChecked())
        s.setValue("device/disable_smart_memory", self.smart.isChecked())
        s.setValue("device/device_index", self.device_index.value())
        for key, box in self.dtypes.items():
            s.setValue(f"device/{key}", box.currentData() or "")
        s.setValue("graph/sample_hz", self.rate.value())
        s.setValue("library/folders", self.folders())
        s.sync()
        self.accept()
