"""Settings: device options (applied at the next start, as the command-line flags), library folders,
and the memory graph's sample rate. Saved with app.settings (QSettings under LOADOUT_CONFIG_DIR)."""

from __future__ import annotations

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
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app import settings as S

VRAM_MODES = (("auto", ""), ("--lowvram", "lowvram"), ("--novram", "novram"), ("--highvram", "highvram"),
              ("--gpu-only", "gpu_only"), ("--cpu", "cpu"))  # fmt: skip


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
    if str(s.value("device/cpu_vae", "false")).lower() == "true":
        out["cpu_vae"] = True
    return out


class SettingsDialog(QDialog):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Loadout settings")
        s = S.settings()
        dev = QGroupBox("Device (takes effect at the next start)")
        form = QFormLayout(dev)
        self.mode = QComboBox()
        for label, key in VRAM_MODES:
            self.mode.addItem(label, key)
        self.mode.setCurrentIndex(max(0, self.mode.findData(s.value("device/mode", ""))))
        self.reserve = QDoubleSpinBox(suffix=" GiB", maximum=512, singleStep=0.1, specialValueText="default")
        self.budget = QDoubleSpinBox(suffix=" GiB", maximum=4096, singleStep=0.5, specialValueText="no cap")
        self.reserve.setValue(float(s.value("device/reserve_vram_gb", 0) or 0))
        self.budget.setValue(float(s.value("device/vram_budget_gb", 0) or 0))
        self.cpu_vae = QCheckBox("Run the VAE on the CPU (--cpu-vae)")
        self.cpu_vae.setChecked(str(s.value("device/cpu_vae", "false")).lower() == "true")
        form.addRow("VRAM mode", self.mode)
        form.addRow("Reserve VRAM", self.reserve)
        form.addRow("VRAM budget", self.budget)
        form.addRow(self.cpu_vae)

        lib = QGroupBox("Library folders")
        ll = QVBoxLayout(lib)
        self.list = QListWidget()
        self.list.addItems(S.library_folders())
        add, remove = QPushButton("Add…"), QPushButton("Remove")
        add.clicked.connect(self._on_add_clicked)
        remove.clicked.connect(lambda: self.list.takeItem(self.list.currentRow()))
        row = QHBoxLayout()
        row.addWidget(add)
        row.addWidget(remove)
        row.addStretch(1)
        ll.addWidget(self.list)
        ll.addLayout(row)

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

    def _on_save(self) -> None:
        s = S.settings()
        s.setValue("device/mode", self.mode.currentData())
        s.setValue("device/reserve_vram_gb", self.reserve.value())
        s.setValue("device/vram_budget_gb", self.budget.value())
        s.setValue("device/cpu_vae", self.cpu_vae.isChecked())
        s.setValue("graph/sample_hz", self.rate.value())
        s.setValue("library/folders", self.folders())
        s.sync()
        self.accept()
