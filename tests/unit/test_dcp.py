"""DCP deserialises the verified bytes only: a file swapped after verification is never read."""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
import time

import pytest
import torch

from recovery.errors import FormatError, VerificationError
from recovery.format.layout import step_dir_name
from recovery.integrity.commits import commit
from recovery.integrity.reads import reader
from recovery.integrity.reads.dcp import VerifiedReader
from recovery.parallel import sharded
from tests import launcher


class _Payload:
    """Unpickling this runs code: what an attacker would put in ``dcp/.metadata``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def _dcp_checkpoint(tmp_path, signer):
    """A committed, signed checkpoint holding a model and optimizer in ``dcp/``."""
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(net.parameters())
    net(torch.randn(4, 3)).sum().backward()
    opt.step()
    final = tmp_path / "run" / step_dir_name(3)
    tmp = final.with_name(final.name + ".tmp-x")
    tmp.mkdir(parents=True)
    groups = sharded.save(net, opt, tmp / "dcp")
    names = sorted(f"dcp/{p.name}" for p in (tmp / "dcp").iterdir())
    commit.commit(final, {"state.json": b"{}"}, {"step": 3}, signer=signer, tmp=tmp, adopt=names)
    return final, net, groups


def _evil(tmp_path) -> tuple[bytes, object]:
    marker = tmp_path / "pwned"
    return pickle.dumps(_Payload(str(marker))), marker


def test_a_metadata_swap_after_verification_is_never_unpickled(tmp_path, signer, trust):
    final, net, groups = _dcp_checkpoint(tmp_path, signer)
    verified = reader.read_verified(final, trust)
    evil, marker = _evil(tmp_path)
    meta = final / "dcp" / ".metadata"
    meta.chmod(0o644)
    meta.write_bytes(evil)  # the swap, between verification and load

    weights = sharded.full_model(verified.files, where=final)
    other = torch.nn.Linear(3, 2)
    other_opt = torch.optim.Adam(other.parameters())
    sharded.load(other, other_opt, verified.files, groups, where=final)

    assert not marker.exists(), "DCP unpickled bytes that were never verified"
    for key, value in net.state_dict().items():
        assert torch.equal(weights[key], value) and torch.equal(other.state_dict()[key], value)
    with pytest.raises(VerificationError):  # and the next verification refuses the swap
        reader.read_verified(final, trust)
    assert not marker.exists()


def test_a_name_that_was_not_verified_is_refused_not_read(tmp_path, signer, trust):
    final, _, _ = _dcp_checkpoint(tmp_path, signer)
    verified = reader.read_verified(final, trust)
    partial = {k: v for k, v in verified.files.items() if not k.endswith(".distcp")}
    with pytest.raises(FormatError, match="not among the checkpoint's verified files"):
        sharded.full_model(partial, where=final)
    fs = VerifiedReader(verified.files, where=final).fs
    with pytest.raises(FormatError, match="read-only"), fs.create_stream(final / "dcp/x", "wb"):
        pass


RACER = """
import os, sys, time
meta, until = sys.argv[1], time.time() + float(sys.argv[4])
good, evil = (open(name, 'rb').read() for name in sys.argv[2:4])
side = os.path.join(os.path.dirname(sys.argv[3]), 'next')
print('racing', flush=True)
while time.time() < until:
    for data in (evil, good):
        with open(side, 'wb') as f:
            f.write(data)
        os.replace(side, meta)
"""


def test_a_racing_writer_never_gets_its_payload_run(tmp_path, signer, trust):
    final, net, _ = _dcp_checkpoint(tmp_path, signer)
    evil, marker = _evil(tmp_path)
    atk = tmp_path / "attacker"
    atk.mkdir()
    (atk / "good").write_bytes((final / "dcp" / ".metadata").read_bytes())
    (atk / "evil").write_bytes(evil)
    meta = final / "dcp" / ".metadata"
    argv = [str(meta), str(atk / "good"), str(atk / "evil"), "8"]
    racer = launcher.Popen([sys.executable, "-c", RACER, *argv], stdout=subprocess.PIPE)
    loaded = refused = 0
    try:
        assert racer.stdout.readline() == b"racing\n"  # its 8 s count from here, not its start
        deadline = time.time() + 6
        while time.time() < deadline and loaded + refused < 200:
            try:
                verified = reader.read_verified(final, trust)
            except VerificationError:
                refused += 1
                continue
            weights = sharded.full_model(verified.files, where=final)
            assert all(torch.equal(weights[k], v) for k, v in net.state_dict().items())
            loaded += 1
    finally:
        racer.kill()
        racer.wait()
        racer.stdout.close()
    assert not marker.exists(), "a racing writer got its pickle run"
    assert refused > 0 and loaded > 0, (loaded, refused)  # both outcomes were exercised


def test_the_hashing_writer_records_the_sha256_of_every_file_dcp_wrote(tmp_path):
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    from recovery.integrity.reads.dcp import HashingWriter

    state = {"w": torch.randn(300, 7), "b": torch.arange(11), "nested": {"x": torch.ones(5)}}
    writer = HashingWriter(tmp_path / "dcp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_save(state, storage_writer=writer, no_dist=True)
    on_disk = {p.name: p.read_bytes() for p in (tmp_path / "dcp").iterdir()}
    assert ".metadata" in on_disk and any(n.endswith(".distcp") for n in on_disk)
    assert writer.records == {
        name: (hashlib.sha256(data).hexdigest(), len(data)) for name, data in on_disk.items()
    }
    back = {"w": torch.empty(300, 7), "b": torch.empty(11, dtype=torch.int64)}
    back["nested"] = {"x": torch.empty(5)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_load(back, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    assert torch.equal(back["w"], state["w"]) and torch.equal(back["b"], state["b"])


def test_a_file_that_changes_while_dcp_writes_it_is_refused_not_recorded(tmp_path):
    """The digest is of the file read back, so a file cut short by someone else between
    DCP's write and its close is caught: its size no longer matches what was written."""
    from recovery.integrity.reads.dcp import HashingWriter

    writer = HashingWriter(tmp_path)
    target = tmp_path / "shard.distcp"
    refused = pytest.raises(OSError, match="shard.distcp: 4096 bytes written but 10 read back")
    with refused, writer.fs.create_stream(target, "wb") as stream:
        stream.write(b"x" * 4096)
        stream.flush()
        os.truncate(target, 10)
    assert writer.records == {}


def test_the_hashing_writer_fsyncs_every_file_itself(tmp_path, monkeypatch):
    """DCP's own fsync is off (sync_files=False), so each stream must fsync its file."""
    import recovery.integrity.reads.dcp as dcp_module

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(dcp_module.os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    writer = dcp_module.HashingWriter(tmp_path)
    assert writer.sync_files is False
    with writer.fs.create_stream(tmp_path / "a.distcp", "wb") as stream:
        stream.write(b"abc")
    assert len(synced) == 1
    assert writer.records == {"a.distcp": (hashlib.sha256(b"abc").hexdigest(), 3)}
