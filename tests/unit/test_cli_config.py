"""The CLI's profiles (corral.cli_config): which profile and token a command uses, switching profiles, and
what `corral up` writes: its `admin` profile, never the user's current one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.cli import main
from corral.cli_config import Config, Profile, connection, write_server_profile
from corral.errors import Unauthenticated, UsageError
from tests.unit.test_cli_errors import config  # noqa: F401 - the autouse fixture: a config file of its own




CA = "/data/ca.pem"


def two_profiles(path: Path) -> None:
    Config({"admin": Profile("localhost:1", "localhost:2", CA, "admin-token", "admin"),
            "alice": Profile("localhost:1", "localhost:2", CA, "alice-token", "alice")}, "alice").save(path)


def test_the_current_profile_or_the_one_named(config: Path) -> None:
    two_profiles(config)
    assert connection().token == "alice-token"
    assert connection("admin").token == "admin-token"
    with pytest.raises(UsageError, match="no profile 'bob'"):
        connection("bob")


def test_corral_token_overrides_the_profiles_token(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    two_profiles(config)
    monkeypatch.setenv("CORRAL_TOKEN", "given")
    assert (connection().token, connection("admin").token, connection("admin").frontend) == (
        "given", "given", "localhost:1")
    assert Config.load(config).profiles["admin"].token == "admin-token"  # read, never written


def test_corral_token_without_any_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Unauthenticated, match="not logged in"):
        connection()
    monkeypatch.setenv("CORRAL_TOKEN", "given")
    assert (connection().token, connection().frontend) == ("given", Profile().frontend)


def test_a_flat_file_from_before_profiles_is_the_profile_default(config: Path) -> None:
    config.write_text(json.dumps({"frontend": "h:1", "auth": "h:2", "ca_cert": CA, "token": "old"}))
    assert Config.load() == Config({"default": Profile("h:1", "h:2", CA, "old")}, "default")
    assert connection().token == "old"


def test_profile_use_switches_and_refuses_an_unknown_name(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    two_profiles(config)
    assert main(["profile", "use", "admin"]) == 0
    assert (Config.load().current, connection().token) == ("admin", "admin-token")
    assert main(["profile", "use", "bob"]) == 2
    assert Config.load().current == "admin"
    capsys.readouterr()
    assert main(["profile", "list"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "* admin  user=admin  frontend=localhost:1  auth=localhost:2",
        "  alice  user=alice  frontend=localhost:1  auth=localhost:2"]


def test_profile_env_prints_a_profile_for_the_shell(config: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`eval "$(corral profile env)"` gives other tools the current (or named) profile; values are quoted for
    the shell, and $CORRAL_TOKEN stands in for the token as it does for every command."""
    Config({"odd": Profile("localhost:1", "localhost:2", "/a dir/ca.pem", "to'ken", "odd")}, "odd").save(config)
    assert main(["profile", "env"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "export CORRAL_FRONTEND=localhost:1", "export CORRAL_AUTH=localhost:2",
        "export CORRAL_CA_CERT='/a dir/ca.pem'", "export CORRAL_TOKEN='to'\"'\"'ken'"]
    monkeypatch.setenv("CORRAL_TOKEN", "given")
    assert main(["profile", "env", "odd"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "export CORRAL_TOKEN=given"
    assert main(["profile", "env", "bob"]) == 2


def test_corral_up_keeps_the_current_profile(config: Path) -> None:
    """A restarted `corral up` (new ports, a new admin token) logs nobody out: alice stays current with her
    token, at the new addresses; a profile of another server is left alone."""
    two_profiles(config)
    elsewhere = Profile("far:1", "far:2", "/other/ca.pem", "far-token")
    loaded = Config.load()
    loaded.profiles["elsewhere"] = elsewhere
    loaded.save()
    current = write_server_profile(Profile("localhost:5", "localhost:6", CA, "new-admin-token", "admin"))
    after = Config.load()
    assert (current, after.current) == ("alice", "alice")
    assert after.profiles == {"admin": Profile("localhost:5", "localhost:6", CA, "new-admin-token", "admin"),
                              "alice": Profile("localhost:5", "localhost:6", CA, "alice-token", "alice"),
                              "elsewhere": elsewhere}
    assert oct(config.stat().st_mode & 0o777) == "0o600"


def test_corral_up_makes_admin_current_when_nothing_is(config: Path) -> None:
    assert write_server_profile(Profile("localhost:5", "localhost:6", CA, "t", "admin")) == "admin"
    assert connection().token == "t"


def test_corral_up_keeps_a_flat_file(config: Path) -> None:
    """The file an older `corral up` or `corral login` wrote stays the current profile."""
    config.write_text(json.dumps({"frontend": "localhost:1", "auth": "localhost:2", "ca_cert": CA, "token": "old"}))
    assert write_server_profile(Profile("localhost:5", "localhost:6", CA, "t", "admin")) == "default"
    assert connection() == Profile("localhost:5", "localhost:6", CA, "old")


def test_corral_up_writes_its_admin_profile_where_it_is_told(tmp_path: Path, config: Path) -> None:
    from services.up.app import Running, _write_client_config
    from services.up.config import UpConfig

    two_profiles(config)
    running = Running(supervisor=None, lifeline=None, lock_fd=-1,  # type: ignore[arg-type]
                      endpoints={"frontend": "localhost:5", "auth": "localhost:6", "ca_cert": CA},
                      admin_token="new-admin-token")
    _write_client_config(UpConfig(tmp_path / "data", client_config=config), running,
                         ("file:///data/storage/{project}/",))
    assert running.cli_profile == "alice"
    assert Config.load(config).profiles["admin"] == Profile("localhost:5", "localhost:6", CA, "new-admin-token",
                                                            "admin", "default", "file:///data/storage/default/tmp")


def test_profile_set_saves_the_pipeline_defaults_and_corral_up_keeps_them(config: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    two_profiles(config)
    assert main(["profile", "set", "billing_project", "lab"]) == 0
    assert main(["--profile", "admin", "profile", "set", "remote_tmpdir", "file:///data/lab/tmp"]) == 0
    saved = Config.load()
    assert (saved.profiles["alice"].billing_project, saved.profiles["alice"].remote_tmpdir) == ("lab", None)
    assert saved.profiles["admin"].remote_tmpdir == "file:///data/lab/tmp"
    assert "profile 'alice': billing_project is lab" in capsys.readouterr().out
    assert main(["profile", "list"]) == 0
    assert "* alice  user=alice  frontend=localhost:1  auth=localhost:2  billing_project=lab" in \
        capsys.readouterr().out.splitlines()
    # corral up writes its admin profile again at each start: a setting the user gave stays, one they did
    # not give takes the server's default.
    write_server_profile(Profile("localhost:3", "localhost:4", CA, "new-token", "admin", billing_project="default",
                                 remote_tmpdir="file:///data/storage/default/tmp"), "admin", config)
    admin = Config.load().profiles["admin"]
    assert (admin.token, admin.billing_project, admin.remote_tmpdir) == ("new-token", "default",
                                                                         "file:///data/lab/tmp")
    assert main(["profile", "unset", "billing_project"]) == 0
    assert Config.load().profiles["alice"].billing_project is None
    with pytest.raises(SystemExit):  # not a setting: argparse names the choices
        main(["profile", "set", "region", "x"])
    assert "invalid choice: 'region'" in capsys.readouterr().err


def test_profile_set_without_any_profile_says_how_to_make_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "set", "billing_project", "lab"]) == 2
    assert "no profile yet: `corral login` makes one" in capsys.readouterr().err
