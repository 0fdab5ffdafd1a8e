"""HAProxy's own check of a gateway candidate before anything of it is installed
(docs/gateway.md, "Approval and updates").

The candidate's configuration and maps are rendered into a private temporary folder, the
credentials (the TLS certificate, the endpoints' own keys) laid out beside them the way
systemd hands them to the unit (`${CREDENTIALS_DIRECTORY}/NAME`), and the HAProxy the unit
runs checks the whole (`haproxy -c -f`): it loads the maps, the Lua and the certificate with
its key, so a mismatched certificate and key, a key with a passphrase or anything else it
would refuse at start is refused here, with HAProxy's own lines, while the running gateway
and its approval are untouched.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from epycd.errors import Refusal
from epycd.gateway.haproxy import GatewayFiles

CHECK_TIMEOUT_S = 60
"""`haproxy -c` of a gateway takes well under a second; a hung one is stopped."""
HAPROXY_FIX = "install Debian's haproxy package (apt-get install haproxy), or set gateway_haproxy"


def haproxy_check(
    haproxy: Path,
    render: Callable[[Path], GatewayFiles],
    credentials: Mapping[str, str],
    *,
    shown: Mapping[str, str],
) -> None:
    """A `Refusal` with HAProxy's lines unless `haproxy -c` accepts the files `render`
    makes for a folder, with `credentials` (credential name -> content) where the unit's
    `LoadCredential=` puts them. `shown` maps a credential name to the file it comes from,
    for HAProxy's lines to name the admin's file rather than the temporary copy."""
    with tempfile.TemporaryDirectory(prefix="epyc-llm-gateway-check-") as tmp:
        folder, held = Path(tmp) / "haproxy", Path(tmp) / "credentials"
        folder.mkdir()
        held.mkdir(mode=0o700)
        for name, text in render(folder).files().items():
            (folder / name).write_text(text)
        for name, text in credentials.items():
            _write_private(held / name, text)
        lines = _run(haproxy, folder / "haproxy.cfg", held)
        if lines is None:
            return
        said = [_shown(line, folder, held, shown) for line in lines]
    raise Refusal(
        "HAProxy refuses the gateway's new configuration: " + " | ".join(said),
        fix="correct what HAProxy names (a certificate and its key must match, the key "
        "without a passphrase, in one PEM file), then run the command again; the running "
        "gateway and its approval are unchanged",
    )


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def _run(haproxy: Path, config: Path, credentials: Path) -> list[str] | None:
    """HAProxy's alert lines, or None when it accepts `config`. Without a terminal and
    with no input, so a key with a passphrase fails at once instead of asking for it."""
    env = {**os.environ, "CREDENTIALS_DIRECTORY": str(credentials)}
    try:
        done = subprocess.run(
            [str(haproxy), "-c", "-f", str(config)],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=CHECK_TIMEOUT_S,
            start_new_session=True,
            check=False,
        )
    except FileNotFoundError:
        raise Refusal(
            f"no HAProxy at {haproxy} to check the gateway with", fix=HAPROXY_FIX
        ) from None
    except PermissionError:
        raise Refusal(f"{haproxy} cannot be run", fix=HAPROXY_FIX) from None
    except subprocess.TimeoutExpired:
        return [f"`{haproxy} -c` did not finish in {CHECK_TIMEOUT_S} s"]
    if done.returncode == 0:
        return None
    output = (done.stderr + done.stdout).splitlines()
    alerts = [line.partition(" : ")[2] or line for line in output if "[ALERT]" in line]
    return alerts or [line for line in output if line.strip()][-3:] or [f"exit {done.returncode}"]


def _shown(line: str, folder: Path, held: Path, shown: Mapping[str, str]) -> str:
    for name, origin in shown.items():
        line = line.replace(str(held / name), origin)
    return line.replace(str(held) + "/", "${CREDENTIALS_DIRECTORY}/").replace(str(folder) + "/", "")
