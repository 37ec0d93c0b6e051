"""The dev key resolves the same from anywhere; the CLI trusts $RECOVERY_SIGNING_KEY."""

from recovery import cli
from recovery.config import SigningConfig
from recovery.format.layout import step_dir_name
from recovery.integrity import trust
from tests.conftest import commit_state, make_signer, tiny_state


def test_the_dev_key_is_per_user_outside_a_project_and_the_same_from_anywhere(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(trust.KEY_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    first = trust.resolve_signer(SigningConfig())
    assert first.dev and first.path.parent == tmp_path / "xdg" / "recovery" / "dev-key"
    monkeypatch.chdir(tmp_path / "b")
    again = trust.resolve_signer(SigningConfig())
    assert again.public_pem == first.public_pem
    assert trust.resolve_trust(SigningConfig()).get(first.key_id) is not None


def test_a_projects_own_dev_key_wins_where_it_exists(tmp_path, monkeypatch):
    monkeypatch.delenv(trust.KEY_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    local = make_signer(tmp_path / ".recovery" / "dev-key")
    assert trust.resolve_signer(SigningConfig()).public_pem == local.public_pem
    assert not (tmp_path / "xdg").exists()


def test_the_cli_trusts_the_key_recovery_signing_key_names(tmp_path, monkeypatch, capsys):
    signer = make_signer(tmp_path / "keys")
    commit_state(tmp_path / "run", tiny_state(), 2, signer)
    path = str(tmp_path / "run" / step_dir_name(2))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(trust.KEY_ENV, raising=False)
    assert cli.main(["verify", path]) == 17
    monkeypatch.setenv(trust.KEY_ENV, str(signer.path))
    assert cli.main(["verify", path]) == 0
