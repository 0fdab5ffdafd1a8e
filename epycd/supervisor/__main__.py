"""`python -m epycd.supervisor`: the supervisor's command line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from epycd.engines import api_key_variables
from epycd.health import (
    API_KEY_ENV,
    PRIMARY_ENDPOINTS,
    GateConfig,
    PrimaryEndpoint,
    credential_path,
    read_api_key,
)
from epycd.supervisor.run import DEFAULT_STALL_TIMEOUT_S, Supervisor, SupervisorOptions


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--name", required=True, help="the endpoint's name")
@click.option("--url", required=True, help="base URL of the server, without /v1")
@click.option("--served-model-name", required=True, help="the id /v1/models must list")
@click.option(
    "--endpoint",
    type=click.Choice(PRIMARY_ENDPOINTS),
    default="chat_completions",
    show_default=True,
    help="the primary endpoint the smoke request goes to",
)
@click.option(
    "--embedding-width",
    type=click.IntRange(min=1),
    help="the numbers in each vector of an embeddings endpoint (any one width if not given)",
)
@click.option(
    "--api-key-file",
    type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path),
    help="file holding the server's API key (sent as a Bearer token, given to it in --api-key-env)",
)
@click.option(
    "--api-key-credential",
    help="name of the unit's credential (LoadCredential=) holding the API key; as --api-key-file",
)
@click.option(
    "--api-key-env",
    type=click.Choice(api_key_variables()),
    default=API_KEY_ENV,
    show_default=True,
    help="the variable the server reads its API key from (its engine's)",
)
@click.option(
    "--health-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="seconds for /v1/models and for each watchdog /health check",
)
@click.option(
    "--load-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=1800.0,
    show_default=True,
    help="seconds for /health to answer 200 while loading",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="seconds for the smoke request",
)
@click.option(
    "--stop-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="seconds between SIGTERM and SIGKILL after a failed gate",
)
@click.option(
    "--stall-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_STALL_TIMEOUT_S,
    show_default=True,
    help="seconds with requests running and no prompt or generated token counted in the "
    "server's /metrics after which the engine counts as hung (the watchdog pings stop)",
)
@click.option(
    "--status-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSON state for epycctl status",
)
@click.argument("server_argv", nargs=-1, required=True, type=click.UNPROCESSED)
def main(
    name: str,
    url: str,
    served_model_name: str,
    endpoint: PrimaryEndpoint,
    embedding_width: int | None,
    api_key_file: Path | None,
    api_key_credential: str | None,
    api_key_env: str,
    health_timeout: float,
    load_timeout: float,
    request_timeout: float,
    stop_timeout: float,
    stall_timeout: float,
    status_file: Path | None,
    server_argv: tuple[str, ...],
) -> None:
    """Start SERVER_ARGV, gate it, and tell systemd when it serves."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format=f"epycd-supervisor[{name}]: %(message)s"
    )
    options = SupervisorOptions(
        name=name,
        gate=GateConfig(
            url=url.rstrip("/"),
            served_model_name=served_model_name,
            endpoint=endpoint,
            embedding_width=embedding_width,
            api_key=read_api_key(api_key_file, "--api-key-file")
            or read_api_key(credential_path(api_key_credential)),
            health_timeout=health_timeout,
            load_timeout=load_timeout,
            request_timeout=request_timeout,
        ),
        status_file=status_file,
        stop_timeout=stop_timeout,
        stall_timeout=stall_timeout,
        api_key_env=api_key_env,
    )
    sys.exit(Supervisor(options, server_argv).run())


if __name__ == "__main__":
    main()
