"""Where the product keeps and finds things (design.md, "Settings").

Every path can be moved with an `EPYCD_` variable, so tests and packaging never touch the
real system folders. The daemon's own settings may also come from `CONFIG_DIR/epycd.conf`
(TOML); environment variables win over that file.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

DEFAULT_CONFIG_DIR = Path("/etc/epyc-llm")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EPYCD_", extra="forbid")

    config_dir: Path = DEFAULT_CONFIG_DIR
    state_dir: Path = Path("/var/lib/epyc-llm")
    run_dir: Path = Path("/run/epyc-llm")
    unit_dir: Path = Path("/etc/systemd/system")
    quadlet_dir: Path = Path("/etc/containers/systemd")
    host_root: Path = Path("/")
    admin_group: str | None = None
    """Members of this group may approve, stop, start and remove besides root."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config_dir = Path(os.environ.get("EPYCD_CONFIG_DIR", DEFAULT_CONFIG_DIR))
        daemon_conf = TomlConfigSettingsSource(settings_cls, toml_file=config_dir / "epycd.conf")
        return (init_settings, env_settings, daemon_conf)

    @property
    def daemon_conf(self) -> Path:
        return self.config_dir / "epycd.conf"


def load_settings() -> Settings:
    """The settings, or an `InputError` naming epycd.conf and the bad key (never a traceback)."""
    import tomllib

    from pydantic import ValidationError

    from epycd.errors import InputError

    conf = Path(os.environ.get("EPYCD_CONFIG_DIR", DEFAULT_CONFIG_DIR)) / "epycd.conf"
    fix = "correct the file or the EPYCD_* variables"
    try:
        return Settings()
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML: {exc}", file=conf, fix=fix) from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, error['loc']))}: {error['msg']}" for error in exc.errors()
        )
        raise InputError(f"invalid settings: {problems}", file=conf, fix=fix) from None
