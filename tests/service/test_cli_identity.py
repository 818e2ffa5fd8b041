"""Who the `corral` command line is, against real auth and frontend services: `corral login --token`,
`$CORRAL_TOKEN`, and profiles (`--profile`, `corral profile use`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from corral.cli_common import EXIT_UNAUTHENTICATED
from corral.cli_config import Config
from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from services.frontend.app import FrontendApp
from tests.service.test_cli import cli_env, corral  # noqa: F401 - cli_env is a fixture


def whoami(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[0]


def one_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The one `error: ...` line, checking it is all of stderr and that the exit code is `code`."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.returncode == code, result.stderr
    return lines[0]


async def test_login_with_a_token_profiles_and_corral_token(cli_env, frontend: FrontendApp,  # noqa: F811
                                                            auth_app: AuthApp, certs: DevCertificateAuthority,
                                                            admin_token: str) -> None:
    server = ["--frontend", f"localhost:{frontend.public_port}", "--auth", f"localhost:{auth_app.public_port}",
              "--ca-cert", str(certs.ca_cert_path)]
    config = Path(cli_env["CORRAL_CONFIG"])

    refused = await corral(cli_env, "login", "--token", "not-a-token", *server)
    one_error(refused, EXIT_UNAUTHENTICATED)
    assert not config.exists()  # nothing saved

    root = await corral(cli_env, "login", "--token", admin_token, *server)
    assert root.returncode == 0 and "logged in as root" in root.stdout, root.stderr
    assert whoami(await corral(cli_env, "whoami")) == "root"
    # alice's login goes to the server of the current profile, and makes hers current.
    alice = await corral(cli_env, "login", "alice")
    assert alice.returncode == 0, alice.stderr
    assert whoami(await corral(cli_env, "whoami")) == "alice"

    # The way back to the administrator: once, then for good.
    assert whoami(await corral(cli_env, "--profile", "root", "whoami")) == "root"
    assert whoami(await corral(cli_env, "whoami")) == "alice"
    assert (await corral(cli_env, "profile", "use", "root")).returncode == 0
    assert whoami(await corral(cli_env, "whoami")) == "root"

    # $CORRAL_TOKEN wins over any profile's token.
    alice_token = Config.load(config).profiles["alice"].token
    assert alice_token is not None
    as_alice = {**cli_env, "CORRAL_TOKEN": alice_token}
    assert whoami(await corral(as_alice, "whoami")) == "alice"
    assert whoami(await corral(as_alice, "--profile", "root", "whoami")) == "alice"
    one_error(await corral({**cli_env, "CORRAL_TOKEN": "bogus"}, "ls"), EXIT_UNAUTHENTICATED)

    # A token you were given, saved under a name of your choosing.
    again = await corral(cli_env, "--profile", "alice-ci", "login", "--token", alice_token)
    assert again.returncode == 0, again.stderr
    assert (Config.load(config).current, whoami(await corral(cli_env, "whoami"))) == ("alice-ci", "alice")
