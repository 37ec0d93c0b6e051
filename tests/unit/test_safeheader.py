"""The hash-only verifier's header check refuses every header the official reader refuses.

Each case is a crafted file read the way ``verify`` reads it (``safeheader.read_hashed``
then ``safeheader.parse``); the comment says what the official reader (safetensors
0.8) does with it.
"""

import os

import pytest
import safetensors

from recovery.errors import FormatError, TruncatedFileError
from recovery.format import safeheader

A = '"dtype":"F32","shape":[2],"data_offsets":[0,8]'


def _file(head: str | bytes, data: bytes = b"\0" * 8) -> bytes:
    body = head.replace("$A", A).encode() if isinstance(head, str) else head
    body += b" " * (-len(body) % 8)
    return len(body).to_bytes(8, "little") + body + data


def _check(tmp_path, blob: bytes) -> safeheader.Header:
    path = tmp_path / "model.safetensors"
    path.write_bytes(blob)
    _, prefix, _ = safeheader.read_hashed(path, size=len(blob))
    return safeheader.parse(prefix, len(blob), name=str(path))


def _official_refuses(blob: bytes) -> bool:
    try:
        safetensors.deserialize(blob)
    except Exception:  # the binding's SafetensorError
        return True
    return False


def test_a_well_formed_header_passes(tmp_path):
    blob = _file('{"__metadata__":{"format":"pt"},"a":{$A}}')
    assert not _official_refuses(blob)
    head = _check(tmp_path, blob)
    assert [(e.key, e.dtype, e.shape, e.begin, e.end) for e in head.entries] == [
        ("a", "F32", (2,), 0, 8)
    ]


REFUSED = {  # id: (header, match, whether the official reader refuses it too)
    "duplicate-tensor": ('{"a":{$A},"a":{$A}}', "'a' twice", False),
    "duplicate-field": (
        '{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
        "'dtype' twice",
        True,
    ),
    "duplicate-metadata": (
        '{"__metadata__":{"k":"1","k":"2"},"a":{$A}}',
        "'k' twice",
        False,
    ),
    "shape-string-item": (
        '{"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}}',
        r"'a' of shape \['2'\], not a list",
        True,
    ),
    "shape-string": (
        '{"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}}',
        "of shape '2'",
        True,
    ),
    "shape-string-12": (
        '{"a":{"dtype":"I8","shape":"12","data_offsets":[0,2]}}',
        "of shape '12'",
        True,
    ),
    "shape-float": (
        '{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}',
        r"of shape \[2.0\]",
        True,
    ),
    "shape-float-frac": (
        '{"a":{"dtype":"I8","shape":[2.7],"data_offsets":[0,2]}}',
        r"of shape \[2.7\]",
        True,
    ),
    "shape-bool": (
        '{"a":{"dtype":"I8","shape":[true,2],"data_offsets":[0,2]}}',
        r"of shape \[True, 2\]",
        True,
    ),
    "shape-negative": (
        '{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}',
        "integers >= 0",
        True,
    ),
    "shape-minus-zero": (
        '{"a":{"dtype":"I8","shape":[-0],"data_offsets":[0,0]},"b":{"dtype":"I8","shape":[8],"data_offsets":[0,8]}}',
        r"of shape \[-0.0\]",
        True,
    ),
    "shape-past-u64": (
        '{"a":{"dtype":"F32","shape":[0,18446744073709551616],"data_offsets":[0,0]}}',
        "of shape",
        True,
    ),
    "elements-past-u64": (
        '{"a":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}',
        "more than 2",
        True,
    ),
    "offsets-strings": (
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":["0","8"]}}',
        "at data_offsets",
        True,
    ),
    "offsets-three": (
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}',
        "not two integers",
        True,
    ),
    "offsets-bool": (
        '{"a":{"dtype":"I8","shape":[1],"data_offsets":[false,true]},'
        '"b":{"dtype":"I8","shape":[7],"data_offsets":[1,8]}}',
        "at data_offsets",
        True,
    ),
    "unknown-field": ('{"a":{$A,"x":1}}', "not exactly", False),
    "missing-field": ('{"a":{"dtype":"F32","shape":[2]}}', "not exactly", True),
    "entry-not-object": ('{"a":[1]}', r"'a' described by \[1\]", True),
    "dtype-unknown": (
        '{"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}}',
        "of dtype 'Q9'",
        True,
    ),
    "dtype-not-string": ('{"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}}', "of dtype 4", True),
    "metadata-list": ('{"__metadata__":[],"a":{$A}}', r"__metadata__ \[\]", True),
    "metadata-number": ('{"__metadata__":{"k":1},"a":{$A}}', "__metadata__", True),
    "metadata-null": ('{"__metadata__":null,"a":{$A}}', "__metadata__ None", False),
    "lone-surrogate": ('{"\\ud800":{$A}}', "unreadable header", True),
    # json.loads(bytes) would take UTF-16; two spaces make 8k bytes, so no padding breaks it
    "utf16": (('{"a":{' + A + "}}  ").encode("utf-16-le"), "unreadable header", True),
    "nan": ('{"__metadata__":{"k":NaN},"a":{$A}}', "__metadata__", True),
}


@pytest.mark.parametrize(("head", "match", "official"), REFUSED.values(), ids=REFUSED.keys())
def test_malformed_header_is_refused(tmp_path, head, match, official):
    blob = _file(head)
    assert _official_refuses(blob) == official
    with pytest.raises(FormatError, match=match) as info:
        _check(tmp_path, blob)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'model.safetensors'}: expected a safetensors file")
    assert "\n" not in message


def test_a_file_that_shrinks_while_read_is_truncated(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    blob = _file('{"a":{$A}}')
    path.write_bytes(blob)
    real = os.preadv

    def shrinking(fd, buffers, offset):
        os.truncate(path, 20)
        return real(fd, buffers, offset)

    monkeypatch.setattr(safeheader.os, "preadv", shrinking)
    with pytest.raises(TruncatedFileError, match=f"expected {len(blob)} bytes, read 20") as info:
        safeheader.read_hashed(path, size=len(blob))
    assert info.value.path == path


@pytest.mark.parametrize(
    ("rows", "n", "problem"),
    [
        ([], 10, None),
        ([0, 3, 9], 10, None),
        ([3, 10], 10, "rows outside 0..9"),
        ([-1, 3], 10, "rows outside 0..9"),
        ([10**6], 10, "rows outside 0..9"),
        ([3, 3], 10, "rows not ascending and unique"),
        ([4, 2, 5], 10, "rows not ascending and unique"),
    ],
)
def test_a_deltas_row_indexes_are_judged_from_their_bytes_as_the_decoder_judges(rows, n, problem):
    import array

    from recovery.format.tensorrefs import row_values

    assert row_values(array.array("q", rows).tobytes(), n) == problem


def test_the_hashing_pass_also_keeps_the_ranges_asked_for_once_it_has_the_header(tmp_path):
    import hashlib

    from recovery.format import safeheader

    header = b'{"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}}'
    data = len(header).to_bytes(8, "little") + header + bytes(range(16))
    path = tmp_path / "t.safetensors"
    path.write_bytes(data)
    start = 8 + len(header)
    asked = []

    def also(head: bytes) -> list[tuple[int, int]]:
        asked.append(head)
        return [(start + 4, start + 12)]

    digest, head, kept = safeheader.read_hashed(path, size=len(data), also=also)
    assert digest == hashlib.sha256(data).hexdigest() and head == data[:start]
    assert asked == [data[:start]] and kept == {(start + 4, start + 12): bytes(range(4, 12))}
