"""Inside a DVC stage nothing is registered, and nothing is recorded as registered."""

from recovery.storage import tracking


def test_inside_a_dvc_stage_a_checkpoint_stays_pending(tmp_path, monkeypatch):
    monkeypatch.setenv(tracking.STAGE_ENV, "train")
    ckpt = tmp_path / "run" / "step-00000002"
    ckpt.mkdir(parents=True)
    assert tracking.register(tmp_path, [ckpt]) is False
    publisher = tracking.Publisher(tmp_path)
    publisher.submit(ckpt)
    publisher.close(10.0)
    assert tracking.status(ckpt.parent) == {}  # not "registered": `recovery sync` will do it
    assert not tracking.dvc_file(ckpt).exists()
