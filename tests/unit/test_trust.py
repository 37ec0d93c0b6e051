"""The dev key resolves the same from anywhere; the CLI trusts $RECOVERY_SIGNING_KEY."""

import os
import shutil

import pytest

from recovery import cli
from recovery.config import SigningConfig
from recovery.errors import SigningKeyError
from recovery.exitcodes import exit_code
from recovery.format.layout import step_dir_name
from recovery.integrity.keys import trust
from recovery.integrity.keys.signing import PRIVATE_KEY_FILE, PUBLIC_KEY_FILE, generate_keypair
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


def _project_checkpoint(tmp_path, monkeypatch):
    """A project (a git root) whose run signed a checkpoint with the dev key it made."""
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    run_dir = project / "checkpoints" / "run"
    monkeypatch.chdir(project)
    signer = trust.resolve_signer(SigningConfig(), near=[run_dir], create_in=trust.PROJECT_DEV_KEY)
    assert signer.dev and signer.path.parent == project / ".recovery" / "dev-key"
    commit_state(run_dir, tiny_state(), 2, signer)
    return project, run_dir / step_dir_name(2), signer


def test_a_projects_checkpoint_is_trusted_from_any_working_directory(tmp_path, monkeypatch):
    from recovery.integrity.reads import reader

    monkeypatch.delenv(trust.KEY_ENV, raising=False)
    monkeypatch.delenv(trust.DEV_KEY_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    project, path, signer = _project_checkpoint(tmp_path, monkeypatch)
    (project / "src" / "deep").mkdir(parents=True)
    monkeypatch.chdir(project / "src" / "deep")  # below the project: the walk up finds it
    assert trust.dev_key_dir() == project / ".recovery" / "dev-key"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # outside it: the key made here is registered
    assert trust.dev_key_dir() == tmp_path / "xdg" / "recovery" / "dev-key"
    manifest = reader.read_manifest(path, trust.resolve_trust(SigningConfig()))
    assert manifest.signer is not None and manifest.signer.trusted and manifest.signer.dev
    assert trust.resolve_signer(SigningConfig(), near=[path.parent]).public_pem == (
        signer.public_pem  # and a resume from elsewhere signs with the project's key
    )
    assert cli.main(["verify", str(path)]) == 0  # and the CLI trusts it from there too


def test_a_key_found_beside_a_checkpoint_is_not_trusted_and_the_message_lists_the_search(
    tmp_path, monkeypatch
):
    from recovery.errors import UntrustedSignerError
    from recovery.integrity.reads import reader

    monkeypatch.delenv(trust.KEY_ENV, raising=False)
    monkeypatch.delenv(trust.DEV_KEY_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    downloaded = tmp_path / "downloaded"  # a checkpoint with a dev key shipped beside it
    signer = make_signer(downloaded / ".recovery" / "dev-key")
    commit_state(downloaded / "run", tiny_state(), 2, signer)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    store = trust.trust_store([tmp_path / "trusted"])
    try:
        reader.read_manifest(downloaded / "run" / step_dir_name(2), store)
        raise AssertionError("a key found beside a checkpoint was trusted")
    except UntrustedSignerError as err:
        message = str(err)
    assert "\n" not in message
    for place in (
        f"signing.trusted / --trusted: {tmp_path / 'trusted'}",
        f"the project's .recovery/dev-key above {tmp_path / 'elsewhere'}: none",
        f"the per-user dev key: {tmp_path / 'xdg' / 'recovery' / 'dev-key'}",
        f"dev keys made on this machine: {tmp_path / 'xdg' / 'recovery' / 'dev-keys'}",
        "--trusted PATH / signing.trusted=PATH",
        "$RECOVERY_DEV_KEY_DIR",
    ):
        assert place in message, (place, message)
    resumed = trust.resolve_signer(SigningConfig(), near=[downloaded / "run"])
    assert resumed.public_pem != signer.public_pem  # a resume there never signs with it
    monkeypatch.setenv(trust.DEV_KEY_ENV, str(downloaded / ".recovery" / "dev-key"))
    assert reader.read_manifest(  # named by the user: trusted
        downloaded / "run" / step_dir_name(2), trust.resolve_trust(SigningConfig())
    ).signer.trusted


def test_a_dev_key_others_can_write_is_never_the_projects(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(trust.DEV_KEY_ENV, raising=False)
    make_signer(tmp_path / ".recovery" / "dev-key")
    monkeypatch.chdir(tmp_path)
    assert trust.dev_key_dir() == tmp_path / ".recovery" / "dev-key"
    (tmp_path / ".recovery").chmod(0o777)
    assert trust.dev_key_dir() == tmp_path / "xdg" / "recovery" / "dev-key"


def test_a_key_shipped_in_a_downloaded_tree_is_not_trusted_from_inside_it(tmp_path, monkeypatch):
    """Working anywhere below a downloaded tree's root, its own ``.recovery/dev-key`` never
    vouches for its checkpoints: above the working directory only keys made here count."""
    monkeypatch.delenv(trust.KEY_ENV, raising=False)
    monkeypatch.delenv(trust.DEV_KEY_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    evil = tmp_path / "downloaded"
    signer = make_signer(evil / ".recovery" / "dev-key")
    commit_state(evil / "runs", tiny_state(), 2, signer)
    monkeypatch.chdir(evil / "runs")
    assert cli.main(["verify", step_dir_name(2)]) == 17
    assert trust.dev_key_dir(fallback=trust.PROJECT_DEV_KEY) != evil / ".recovery" / "dev-key"


def test_keys_are_made_private_whatever_the_umask_and_a_writable_registry_is_ignored(
    tmp_path, monkeypatch
):
    from recovery.integrity.keys import devkeys

    monkeypatch.delenv(trust.KEY_ENV, raising=False)
    monkeypatch.delenv(trust.DEV_KEY_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "project" / ".git").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "project")
    old = os.umask(0o002)  # Debian's per-user-group umask
    try:
        made = trust.resolve_signer(SigningConfig(), create_in=trust.PROJECT_DEV_KEY)
    finally:
        os.umask(old)
    for directory in (made.path.parent, made.path.parent.parent, devkeys.registry()):
        assert directory.stat().st_mode & 0o077 == 0, directory
    assert devkeys.registered_keys()  # believed: the registry is this user's alone
    devkeys.registry().chmod(0o777)  # another user could plant a key here now
    assert devkeys.registered_keys() == []


def test_a_private_key_beside_another_keys_public_half_is_refused_before_it_signs(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("RECOVERY_SIGNING_KEY", raising=False)
    mine, other = tmp_path / "mine", tmp_path / "other"
    generate_keypair(mine)
    generate_keypair(other)
    cfg = SigningConfig(key=str(mine / PRIVATE_KEY_FILE))
    assert trust.resolve_signer(cfg).path == mine / PRIVATE_KEY_FILE  # a pair: signs
    shutil.copy(other / PRIVATE_KEY_FILE, mine / PRIVATE_KEY_FILE)  # the public half stays
    with pytest.raises(SigningKeyError, match="is not the half of recovery.pub beside it") as e:
        trust.resolve_signer(cfg)
    assert exit_code(e.value) == 20
    monkeypatch.setenv("RECOVERY_SIGNING_KEY", str(mine / PRIVATE_KEY_FILE))
    with pytest.raises(SigningKeyError):
        trust.resolve_signer(SigningConfig())
    (mine / PUBLIC_KEY_FILE).unlink()  # a private key alone is taken as it is
    assert trust.resolve_signer(SigningConfig()).path == mine / PRIVATE_KEY_FILE
