"""Where the product keeps and finds things (docs/architecture.md, "Settings").

Every path can be moved with an `EPYCD_` variable, so tests and packaging never touch the
real system folders. The daemon's own settings may also come from `CONFIG_DIR/epycd.conf`
(TOML); environment variables win over that file.
"""

from __future__ import annotations

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


def _absolute(path: Path) -> Path:
    if not path.is_absolute():
        raise ValueError(f"{str(path)!r} is not an absolute path")
    return path


AbsolutePath = Annotated[Path, AfterValidator(_absolute)]


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


def load_settings() -> Settings:
    """The settings, or an `InputError` naming epycd.conf and the bad key (never a traceback)."""
    import tomllib

    from pydantic import ValidationError

    from epycd.errors import InputError, file_error

    conf = daemon_conf_path()
    fix = "correct the file or the EPYCD_* variables"
    try:
        return Settings()
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
