"""Where the product keeps and finds things (docs/architecture.md, "Settings").

Every path can be moved with an `EPYCD_` variable, so tests and packaging never touch the
real system folders. The daemon's own settings may also come from `CONFIG_DIR/epycd.conf`
(TOML); environment variables win over that file.
"""

from __future__ import annotations

import os
import stat
from functools import cache
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from epycd.paths import DEFAULT_CONFIG_DIR, EMBEDDED_RUNTIME, daemon_conf_path
from epycd.readfile import STATE_MAX_BYTES, RefusedFile, read_bytes
from epycd.text import is_digits


def _absolute(path: Path) -> Path:
    if not path.is_absolute():
        raise ValueError(f"{str(path)!r} is not an absolute path")
    return path


AbsolutePath = Annotated[Path, AfterValidator(_absolute)]


def _listen_address(value: str) -> str:
    """`ADDRESS:PORT` (an IPv6 address in brackets), or "" for none."""
    if value:
        parse_listen(value)
    return value


def parse_listen(value: str) -> tuple[str, int]:
    """(address, port) of `ADDRESS:PORT`; ValueError saying what is wrong."""
    import ipaddress

    address, colon, port_text = value.rpartition(":")
    if not colon or not is_digits(port_text) or not 0 < int(port_text) < 65536:
        raise ValueError(
            f'{value!r} is not ADDRESS:PORT (e.g. 127.0.0.1:9464, [::1]:9464; "" for none)'
        )
    bare = address[1:-1] if address.startswith("[") and address.endswith("]") else address
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        raise ValueError(f"{address!r} in {value!r} is not an IP address") from None
    if ip.version == 6 and bare == address:
        raise ValueError(f"write an IPv6 address in brackets: [{bare}]:{port_text}")
    return bare, int(port_text)


ListenAddress = Annotated[str, AfterValidator(_listen_address)]


def _gateway_address(value: str) -> str:
    """A listen address HAProxy's `bind` takes: no IPv6 zone (`fe80::1%eth0`), which
    HAProxy's address syntax has no place for (it refuses `[fe80::1%eth0]:8080`)."""
    _listen_address(value)
    if "%" in value:
        bare, port = parse_listen(value)
        raise ValueError(
            f"{value!r} names an IPv6 zone (%{bare.partition('%')[2]}), which HAProxy cannot "
            f"bind: give an address without it, such as [::]:{port} (every address) or a "
            "global or unique-local address of this host"
        )
    return value


GatewayAddress = Annotated[str, AfterValidator(_gateway_address)]
"""Where the gateway (HAProxy) listens: `ListenAddress` without an IPv6 zone."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EPYCD_", extra="forbid")

    config_dir: AbsolutePath = DEFAULT_CONFIG_DIR
    state_dir: AbsolutePath = Path("/var/lib/epyc-llm")
    run_dir: AbsolutePath = Path("/run/epyc-llm")
    unit_dir: AbsolutePath = Path("/etc/systemd/system")
    quadlet_dir: AbsolutePath = Path("/etc/containers/systemd")
    host_root: AbsolutePath = Path("/")
    runtime_dir: AbsolutePath = EMBEDDED_RUNTIME
    """The embedded runtime's venv: `runtime = "auto"` and quickstart serve with its
    bin/vllm where no container runtime (and no other host vLLM) is present."""
    admin_group: str | None = None
    """Members of this group may approve, stop, start and remove besides root."""
    metrics_listen: ListenAddress = "127.0.0.1:9464"
    """Where epycd serves Prometheus metrics at /metrics (docs/metrics.md); "" serves none.
    epycd.service lets it bind only loopback port 9464: another address or port needs a
    drop-in (`SocketBindAllow=`, `IPAddressAllow=`)."""
    gateway_listen: GatewayAddress = ""
    """Where the gateway, one URL for every approved endpoint (docs/gateway.md), listens;
    "" (the default): no gateway."""
    gateway_metrics_listen: GatewayAddress = "127.0.0.1:9465"
    """Where the gateway serves HAProxy's Prometheus exporter at /metrics (requests, errors
    and latency per endpoint) and its use by client and model at /usage, which epycd's own
    /metrics turns into series (docs/gateway.md, "Metrics"); "" serves neither."""
    gateway_tls_cert_file: AbsolutePath | None = None
    """A PEM file with the gateway's certificate, its chain and its key (root only): the
    gateway then speaks HTTPS (HTTP/2 and HTTP/1.1)."""
    gateway_haproxy: AbsolutePath = Path("/usr/sbin/haproxy")
    """The HAProxy the gateway runs (Debian's package), which also checks each new
    configuration (`haproxy -c`) before it is installed."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        daemon_conf = TomlConfigSettingsSource(settings_cls, toml_file=daemon_conf_path())
        return (init_settings, env_settings, daemon_conf)

    @property
    def daemon_conf(self) -> Path:
        return self.config_dir / "epycd.conf"


@cache
def settings_model() -> type[Settings]:
    """`Settings` with each engine's own (`SETTINGS`, a model in its package's settings.py,
    where it has one): the type settings are loaded as. An engine reads its own through its
    model."""
    from importlib.util import find_spec

    from epycd import engines
    from epycd.engines.base import extended

    return extended(
        Settings,
        (
            engine.implementation("settings", "SETTINGS", type)
            for engine in engines.ENGINES
            if find_spec(f"{engine.package}.settings") is not None
        ),
    )


def load_settings() -> Settings:
    """The settings, or an `InputError` naming epycd.conf and the bad key (never a traceback)."""
    import tomllib

    from pydantic import ValidationError

    from epycd.errors import InputError, file_error

    conf = daemon_conf_path()
    fix = "correct the file or the EPYCD_* variables"
    try:
        read_bytes(conf, STATE_MAX_BYTES)  # a folder, FIFO or device is bad input, not absent
    except FileNotFoundError:
        pass
    except RefusedFile as exc:
        raise InputError(
            exc.strerror or str(exc), file=conf, fix="make it a TOML file of settings, or delete it"
        ) from None
    except OSError:
        pass  # reported below as pydantic reads it
    try:
        return settings_model()()
    except UnicodeDecodeError:
        raise InputError("is not UTF-8 text", file=conf, fix="save it as UTF-8") from None
    except OSError as exc:
        raise file_error(exc, "cannot read") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML: {exc}", file=conf, fix=fix) from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, error['loc']))}: {error['msg']}" for error in exc.errors()
        )
        raise InputError(f"invalid settings: {problems}", file=conf, fix=fix) from None


def root_controlled(info: os.stat_result) -> bool:
    return info.st_uid == 0 and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def trusted_admin_group(conf: Path) -> str | None:
    """`admin_group` of `conf`, only when root alone can have written it (file and folder
    owned by root, writable by nobody else, not a symlink, a regular file); else None."""
    import tomllib

    try:
        if not root_controlled(conf.parent.stat()):
            return None
        fd = os.open(conf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not root_controlled(info):
            return None
        raw = os.read(fd, STATE_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > STATE_MAX_BYTES:
        return None
    try:
        group = tomllib.loads(raw.decode("utf-8")).get("admin_group")
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    return group if isinstance(group, str) and group else None


def trusted_admin_gid(conf: Path) -> int | None:
    """The gid of `trusted_admin_group(conf)`, None without one (or when no such group)."""
    import grp

    name = trusted_admin_group(conf)
    if name is None:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None
