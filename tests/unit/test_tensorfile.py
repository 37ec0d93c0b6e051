"""The streaming writer produces files the official safetensors reader accepts, bit for bit."""

import hashlib
import os
import pickle

import pytest
import safetensors.torch
import torch

from recovery.errors import FormatError
from recovery.format import tensorfile


def tensors():
    torch.manual_seed(0)
    base = torch.randn(6, 5)
    return {
        "w": torch.randn(300, 70),
        "bf16": torch.randn(7, 3).to(torch.bfloat16),
        "scalar": torch.tensor(3.0),
        "empty": torch.zeros(0, 4),
        "ints": torch.arange(10, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "strided": base.t(),  # non-contiguous
        "view": base[1:3],  # shares storage with 'strided'
        "u8": torch.randint(0, 255, (9,), dtype=torch.uint8),
    }


def test_official_reader_gets_every_tensor_back(tmp_path):
    src = tensors()
    rec = tensorfile.write_stream(tmp_path / "t.safetensors", tensorfile.chunks(src))
    data = (tmp_path / "t.safetensors").read_bytes()
    assert rec.size == len(data) == tensorfile.size_of(src)
    assert rec.digest == hashlib.sha256(data).hexdigest()
    back = safetensors.torch.load(data)
    assert back.keys() == src.keys()
    for k, v in src.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k


def test_header_is_aligned_and_metadata_kept():
    head = tensorfile.header({"a": torch.zeros(3)}, metadata={"format": "pt"})
    n = int.from_bytes(head[:8], "little")
    assert n % 8 == 0 and len(head) == 8 + n
    blob = head + torch.zeros(3).numpy().tobytes()
    assert safetensors.torch.load(blob)["a"].shape == (3,)


def test_every_file_says_format_pt_so_hf_loaders_accept_it(tmp_path):
    # transformers warns about (or refuses) a safetensors file without {"format": "pt"}
    tensorfile.write_stream(tmp_path / "t", tensorfile.chunks({"a": torch.zeros(3)}))
    with safetensors.safe_open(tmp_path / "t", "pt") as f:
        assert f.metadata() == {"format": "pt"}
    head = tensorfile.header({"a": torch.zeros(3)}, metadata={"note": "x"})
    blob = head + torch.zeros(3).numpy().tobytes()
    assert safetensors.deserialize(blob) and b'"format":"pt","note":"x"' in head


def test_large_tensor_streams_in_chunks(tmp_path):
    big = torch.randn(tensorfile.CHUNK // 4 * 3 + 5)
    parts = list(tensorfile.chunks({"big": big}))
    assert len(parts) == 1 + 4
    tensorfile.write_stream(tmp_path / "b", parts)
    assert torch.equal(safetensors.torch.load_file(str(tmp_path / "b"))["big"], big)


def test_unsupported_dtype():
    with pytest.raises(FormatError, match="complex"):
        tensorfile.header({"c": torch.zeros(2, dtype=torch.complex64)})


def test_reads_what_the_official_writer_wrote_without_copying():
    src = {k: v.contiguous() for k, v in tensors().items() if k != "view"}
    blob = torch.frombuffer(bytearray(safetensors.torch.save(src)), dtype=torch.uint8)
    back = tensorfile.views(blob, name="x")
    for k, v in src.items():
        assert torch.equal(back[k], v), k
    big = back["w"]
    assert big.untyped_storage().data_ptr() == blob.untyped_storage().data_ptr()  # a view


def test_read_hashed(tmp_path):
    src = tensors()
    rec = tensorfile.write_stream(tmp_path / "t", tensorfile.chunks(src))
    buf, digest = tensorfile.read_hashed(tmp_path / "t", size=rec.size)
    assert digest == rec.digest
    assert torch.equal(tensorfile.views(buf, name="t")["w"], src["w"])


def _blob(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _file(head: dict, data: bytes) -> bytes:
    import json

    body = json.dumps(head).encode()
    body += b" " * (-len(body) % 8)
    return len(body).to_bytes(8, "little") + body + data


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (pickle.dumps({"a": 1}), "header length"),
        (b"\x01", "1 bytes"),
        (
            _file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
            "spanning",
        ),
        (_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8), "gap"),
        (
            _file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8),
            "file size",
        ),
        (
            _file({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
            "of dtype 'Q9'",
        ),
        (
            _file({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
            "integers >= 0",
        ),
        (_file([1, 2], b""), "not a JSON object"),
    ],
    ids=["pickle", "tiny", "size", "gap", "trailing", "dtype", "negative", "not-object"],
)
def test_malformed_files_are_refused(data, match):
    with pytest.raises(FormatError, match=match):
        tensorfile.views(_blob(data), name="model.safetensors")


def test_progress_bar_only_on_a_terminal(monkeypatch, capsys):
    from recovery import progress

    seen = []
    with progress.bytes_bar(1 << 40, "saving x") as update:  # pytest's stderr is no terminal
        update(5)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: True, raising=False)
    with progress.bytes_bar(progress.MIN_BYTES, "saving step-00000001") as update:
        seen.append(update)
        update(progress.MIN_BYTES)
    assert "saving step-00000001" in capsys.readouterr().err
    with progress.bytes_bar(progress.MIN_BYTES - 1, "small") as update:
        update(1)
    assert capsys.readouterr().err == ""


def test_hash_fd_reads_the_whole_file_without_moving_the_descriptor(tmp_path):
    """The DCP writer hashes a file through a second descriptor while it is fsynced: the
    digest is of every byte from the start, whatever that descriptor's offset."""

    data = os.urandom(tensorfile.CHUNK + 12345)  # more than one buffer
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    seen: list[int] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, 100, os.SEEK_SET)
        got = tensorfile.hash_fd(fd, progress=seen.append)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 100
    finally:
        os.close(fd)
    assert got == (hashlib.sha256(data).hexdigest(), len(data))
    assert sum(seen) == len(data) and len(seen) == 2
    assert tensorfile.hash_file(path) == got
