"""A long CLI command says on stderr what it is doing; stdout stays its result."""

from __future__ import annotations

import json

from recovery import cli
from recovery.cli.commands import reading


def test_verify_of_a_large_checkpoint_says_what_it_reads_on_stderr(
    checkpoint, capsys, signer, monkeypatch
):
    path, _ = checkpoint
    monkeypatch.setattr(reading, "LARGE", 1)  # every checkpoint is large
    trusted = ["--trusted", str(signer.path.parent)]
    assert cli.main(["verify", str(path), "--json", *trusted]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["ok"] is True
    assert out.err.startswith("verify: reading and hashing ") and str(path) in out.err
    monkeypatch.setattr(reading, "LARGE", 1 << 40)
    assert cli.main(["verify", str(path), *trusted]) == 0
    assert capsys.readouterr().err == ""  # a small one answers at once, silently
