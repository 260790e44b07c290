"""`--json` output: the scan's fast encoder (msgspec) writes what json.dumps writes."""

from __future__ import annotations

import json

import pytest

from engine.cli._common import print_json


@pytest.mark.parametrize(
    "obj",
    [
        [{"path": "/models/é/日本.safetensors", "reason": "768 (CLIP-L) \u2192 SD1", "emoji": "\U0001f600"}],
        {"a": [], "b": {}, "c": [1, -2, 2.5, None, True, False, (3, 4)], "d": {"x": {"y": [0.1]}}},
        [],
        {"quote": 'a "b" \\ c\n\t\x01'},
    ],
)
def test_plain_output_is_json_dumps_byte_for_byte(capsys, obj):
    print_json(obj)
    slow = capsys.readouterr().out
    print_json(obj, plain=True)
    assert capsys.readouterr().out == slow == json.dumps(obj, indent=2) + "\n"


def test_what_the_fast_encoder_refuses_goes_through_json_dumps(capsys):
    from types import MappingProxyType

    obj = [{"path": "/models/bad\udcff.safetensors", "facts": MappingProxyType({"n": 1})}]
    print_json(obj, plain=True)
    assert json.loads(capsys.readouterr().out) == [
        {"path": "/models/bad\udcff.safetensors", "facts": {"n": 1}}
    ]
