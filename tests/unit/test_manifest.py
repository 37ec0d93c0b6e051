import json
from pathlib import Path

import pytest

from recovery.errors import ManifestError, UnsafePathError
from recovery.format import manifest
from recovery.format.manifest import FileRecord


def files():
    return [FileRecord("b.safetensors", "11" * 32, 5), FileRecord("a.json", "22" * 32, 7)]


def test_statement_has_model_signing_shape():
    st = manifest.build("step-00000001", files(), {"step": 1})
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://model_signing/signature/v1.0"
    assert [r["name"] for r in st["predicate"]["resources"]] == ["a.json", "b.safetensors"]
    assert st["predicate"]["serialization"]["ignore_paths"] == ["model.sig"]
    expected_root = manifest.root_digest(sorted(files(), key=lambda r: r.name))
    assert st["subject"] == [{"name": "step-00000001", "digest": {"sha256": expected_root}}]
    parsed = manifest.parse(manifest.payload(st), where=Path("x"))
    assert parsed.step == 1 and parsed.recovery["sizes"] == {"a.json": 7, "b.safetensors": 5}


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../b", "", "a\\b", "./a", "a//b"])
def test_unsafe_names_refused(name):
    with pytest.raises(UnsafePathError):
        manifest.check_relpath(name, where=Path("ckpt"))


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda st: st.update(_type="x"), "_type"),
        (lambda st: st.update(predicateType="x"), "predicateType"),
        (lambda st: st["subject"][0]["digest"].update(sha256="00" * 32), "subject digest"),
        (lambda st: st["predicate"].pop("resources"), "malformed"),
        (lambda st: st["predicate"]["resources"][0].update(algorithm="md5"), "sha256"),
    ],
)
def test_malformed_statements(edit, match):
    st = manifest.build("s", files(), {"step": 1})
    edit(st)
    with pytest.raises(ManifestError, match=match):
        manifest.parse(json.dumps(st).encode(), where=Path("x"))


def test_not_json():
    with pytest.raises(ManifestError, match="undecodable"):
        manifest.parse(b"\x80garbage", where=Path("x"))
