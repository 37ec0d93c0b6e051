"""recovery.access: a refused permission said in one line (what for, owner, mode, user)."""

from __future__ import annotations

import errno
import os
import pwd

from recovery import access
from recovery.errors import PermissionDeniedError
from recovery.exitcodes import exit_code


def test_the_line_names_the_path_its_use_owner_mode_and_this_user(tmp_path):
    key = tmp_path / "recovery.key"
    key.write_text("x")
    key.chmod(0o640)
    err = PermissionError(errno.EACCES, "Permission denied", str(key))
    denied = access.denied(err, "the signing key", "or point signing.key elsewhere")
    me = pwd.getpwuid(os.getuid()).pw_name
    assert isinstance(denied, PermissionDeniedError) and exit_code(denied) == 31
    assert denied.path == key
    assert str(denied) == (
        f"{key}: permission denied (the signing key; owner {me} (uid {os.getuid()}), "
        f"mode 0640; this process runs as {me} (uid {os.getuid()})): run as a user who may "
        "use it, or change its permissions; or point signing.key elsewhere"
    )


def test_a_path_it_cannot_see_is_described_by_the_directory_above_it(tmp_path):
    hidden = tmp_path / "shut" / "recovery.pub"
    (tmp_path / "shut").mkdir(mode=0o700)
    assert access.describe(hidden).endswith(f"mode 0700 ({tmp_path / 'shut'}, above it)")


def test_no_file_name_names_what_it_was_for_and_no_remedy_adds_nothing():
    denied = access.denied(PermissionError(errno.EPERM, "Operation not permitted"), "x", "")
    assert str(denied).startswith("x: permission denied (x; this process runs as ")
    assert str(denied).endswith("or change its permissions")
