"""The Inspector panel: everything detection knows about one file — components, metadata (kohya tags
as chips, trigger words), and the evidence that decided the architecture — as rich text."""

from __future__ import annotations

import html

from PySide6.QtWidgets import QTextBrowser, QVBoxLayout, QWidget

from app.models.library_model import human_params
from engine.detect.result import thaw
from engine.formatting import algo_names, human_bytes

CHIP = ("<span style='background-color:{bg}; color:#111; padding:2px 6px; border-radius:8px;'>"
        "&nbsp;{text}&nbsp;</span>&nbsp; ")  # fmt: skip


def _e(x) -> str:
    return html.escape(str(x))


def chips(words, bg: str = "#cfe3ff") -> str:
    """Words as chips. A chip never breaks across lines (its spaces are non-breaking), and kohya's
    A1111-style escapes (`\\(umamusume\\)`, written so the prompt parser reads literal brackets) are
    shown as the plain text a user would type."""
    return "".join(
        CHIP.format(bg=bg, text=_e(str(w).replace("\\(", "(").replace("\\)", ")")).replace(" ", "&nbsp;"))
        for w in words
    )


def trigger_words(entry) -> list[str]:
    words: list[str] = []
    notes = entry.notes or {}
    words += notes.get("trained_words") or []
    ms = entry.detection.summary.modelspec.get("trigger_phrase")
    if ms:
        words += [w.strip() for w in ms.split(",") if w.strip()]
    return list(dict.fromkeys(words))


def render(entry, sha256: str | None = None) -> str:
    """The inspector's HTML for one LibraryEntry."""
    d = entry.detection
    out = [f"<h2 style='margin-bottom:2px'>{_e(entry.name)}</h2>"]
    facts = [d.kind or "unknown"]
    if d.architecture:
        facts.append(f"<b>{_e(d.architecture)}</b>")
    if d.also:  # other families whose releases use this very layout
        facts.append(f"also {_e(', '.join(d.also))}")
    for k, v in (("variant", d.variant), ("prediction", d.prediction)):
        if v and v != "normal":
            facts.append(f"{k} {_e(v)}")
    params = d.params
    facts.append(human_bytes(entry.size))
    if params:
        facts.append(f"{human_params(params)} params")
    facts.append(_e(d.format or "?"))
    out.append("<p>" + " · ".join(facts) + "</p>")
    out.append(f"<p style='color:gray'>{_e(entry.path)}</p>")
    err = d.error
    if err:
        color = "#b7791f" if err.type == "unsupported" else "#c0392b"
        out.append(f"<p style='color:{color}'><b>{_e(err.type)}:</b> {_e(err.message)}</p>")
    if entry.kind_mismatch:
        out.append(f"<p style='color:#b7791f'>The folder says <b>{_e(entry.declared_kind)}</b>, "
                   f"the header says <b>{_e(entry.kind)}</b>.</p>")  # fmt: skip
    if entry.preview:
        out.append(f"<p><img src='{_e(entry.preview)}' width='128'></p>")
    comps = d.components
    if set(comps) == {"other"} and d.lora:
        comps = {}  # an adapter's tensors are not a model component: the LoRA section says what it targets
    if comps:
        out.append("<h3>Components</h3><table cellspacing='0' cellpadding='3'>"
                   "<tr><th align='left'>name</th><th align='right'>tensors</th><th align='right'>params</th>"
                   "<th align='right'>bytes</th><th align='left'>dtype</th><th align='left'>prefix</th></tr>")  # fmt: skip
        for name, c in comps.items():
            out.append(
                f"<tr><td><b>{_e(name)}</b></td><td align='right'>{c.tensors}</td>"
                f"<td align='right'>{human_params(c.params)}</td>"
                f"<td align='right'>{human_bytes(c.bytes)}</td><td>{_e(c.dtype or '')}</td>"
                f"<td><code>{_e(c.prefix)}</code></td></tr>"
            )
        out.append("</table>")
    lora = d.lora
    if lora:
        out.append("<h3>LoRA</h3><p>")
        out.append(f"format <b>{_e(lora.format)}</b> · algorithms {_e(algo_names(lora.algos))}"
                   f" · rank {_e(lora.rank)} · alpha {_e(lora.alpha)}"
                   f" · base <b>{_e(lora.base or 'unknown')}</b>"
                   f" · targets {_e(', '.join(lora.targets))}")  # fmt: skip
        out.append("</p>")
    words = trigger_words(entry)
    if words:
        out.append("<h3>Trigger words</h3><p>" + chips(words, "#ffe2a8") + "</p>")
    summary = d.summary
    tags = summary.training.get("top_tags") or ()
    if tags:
        out.append("<h3>Training tags</h3><p>" + chips(f"{t} · {n}" for t, n in tags) + "</p>")
    rows = []
    for section in ("modelspec", "training", "other"):
        for k, v in getattr(summary, section).items():
            if k == "top_tags":
                continue
            rows.append(f"<tr><td style='color:gray'>{_e(k)}</td><td>{_e(thaw(v))}</td></tr>")
    notes = entry.notes or {}
    for k in ("model_name", "version_name", "base_model", "description", "preferred_weight", "notes"):
        if notes.get(k) not in (None, ""):
            rows.append(f"<tr><td style='color:gray'>{_e(k)} (notes)</td><td>{_e(notes[k])}</td></tr>")
    if rows:
        out.append("<h3>Metadata</h3><table cellpadding='2'>" + "".join(rows) + "</table>")
    raw = d.metadata
    if raw:
        out.append(f"<p style='color:gray'>{len(raw)} raw metadata keys in the header.</p>")
    ev = d.evidence
    if ev:
        out.append("<h3>Evidence</h3><ul>")
        for x in ev:
            shape = f" {list(x.shape)}" if x.shape else ""
            key = f"<code>{_e(x.key)}</code>{_e(shape)} → " if x.key else ""
            out.append(f"<li>{key}{_e(x.reason)}</li>")
        out.append("</ul>")
    if sha256:
        out.append(f"<p style='color:gray'>SHA-256 {_e(sha256)} (AutoV2 {_e(sha256[:10])})</p>")
    return "".join(out)


class InspectorPanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.entry = None
        self.browser = QTextBrowser()
        self.browser.setOpenLinks(False)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.browser)
        self.browser.setHtml("<p style='color:gray'>Select a file in the library to see what it is.</p>")

    def show_entry(self, entry, sha256: str | None = None) -> None:
        self.entry = entry
        self.browser.setHtml(render(entry, sha256))
        self.browser.document().setMetaInformation(
            self.browser.document().MetaInformation.DocumentTitle, entry.name
        )

    def text(self) -> str:
        return self.browser.toPlainText()
