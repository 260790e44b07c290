"""Errors the engine raises. Every message is written for the user: what happened and what to do."""

from __future__ import annotations

import os


class EngineError(Exception):
    """Base of every error the engine reports on purpose (anything else is a bug)."""

    type = "error"

    def __init__(self, message: str, *, path: str | None = None):
        super().__init__(message)
        self.message = message
        self.path = path

    def to_json(self) -> dict:
        return {"type": self.type, "message": self.message}


class FormatError(EngineError):
    """A file is corrupt, truncated, hostile (e.g. a pickle that would run code) or not a model."""

    type = "format"


class UnsupportedModel(EngineError):
    """A real model in a format or layout Loadout cannot load (yet): IQ-type GGUF, nvfp4, 4-bit, ..."""

    type = "unsupported"


class OutOfMemory(EngineError):
    """The device or RAM budget cannot hold what was asked for."""

    type = "oom"


class InvalidRequest(EngineError):
    """What was asked cannot be done as asked, whatever the files hold: an option names something that
    is not there (--device 3 on a one-GPU machine, a component the file lacks) or an output would
    overwrite an input. The command line's usage error (exit 2)."""

    type = "usage"


class Cancelled(Exception):
    """The user interrupted a job; state was left consistent. Not an EngineError: a cancellation is
    not a failure, so `except EngineError` never catches it — every caller that reports failures lets
    it through to the one place that says "stopped" (the bridge's `cancelled` signal, exit code 130)."""

    type = "cancelled"

    def __init__(self, message: str = "Cancelled by the user.", *, path: str | None = None):
        super().__init__(message)
        self.message = message
        self.path = path

    def to_json(self) -> dict:
        return {"type": self.type, "message": self.message}


def from_json(error: dict, path: str | os.PathLike | None = None) -> EngineError:
    """The exception an `error` object (a Detection's, `to_json()`'s) describes; its type picks the kind.

    With `path`, the message names the file unless it already does: a Detection keeps its path beside
    its error, so some of its messages ("this is a text file, not a model file") do not repeat it, and
    alone on a console they would not say which file they are about."""
    kinds = {k.type: k for k in (FormatError, UnsupportedModel, OutOfMemory, InvalidRequest)}
    message = error.get("message") or "the file cannot be read"
    path = os.fspath(path) if path is not None else None
    if path and path not in message:
        message = f"{path}: {message}"
    return kinds.get(error.get("type"), EngineError)(message, path=path)
