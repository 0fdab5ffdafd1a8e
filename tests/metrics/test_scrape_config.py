"""`epycctl metrics scrape-config`: a scrape job the real `promtool check config` accepts,
for this host's metrics_listen."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from epycd.cli import main
from tests.metrics.conftest import promtool


def scrape_config(tmp_path: Path, listen: str, *args: str) -> tuple[int, str, str]:
    env = {"EPYCD_CONFIG_DIR": str(tmp_path), "EPYCD_METRICS_LISTEN": listen}
    result = CliRunner().invoke(main, ["metrics", "scrape-config", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


def checked(tmp_path: Path, block: str) -> str:
    """The block under scrape_configs: in a prometheus.yml, through promtool."""
    config = tmp_path / "prometheus.yml"
    config.write_text("scrape_configs:\n" + block + "\n")
    done = subprocess.run(
        [str(promtool()), "check", "config", str(config)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def fields(block: str) -> dict[str, str]:
    """key -> value of the block's lines (values as written: JSON strings)."""
    found = {}
    for line in block.splitlines():
        if line.lstrip().startswith("#") or ":" not in line:
            continue
        key, _, value = line.strip().removeprefix("- ").partition(": ")
        found[key] = value
    return found


def test_the_default_is_loopback_for_a_prometheus_on_this_host(tmp_path: Path) -> None:
    code, out, err = scrape_config(tmp_path, "127.0.0.1:9464")
    assert code == 0, err
    assert "SUCCESS" in checked(tmp_path, out)
    host = socket.gethostname()
    assert fields(out) == {
        "job_name": '"epyc-llm"',
        "scrape_interval": '"15s"',
        "scrape_timeout": '"10s"',
        "metrics_path": '"/metrics"',
        "static_configs:": "",
        "targets": '["127.0.0.1:9464"]',
        "labels:": "",
        "host": f'"{host}"',
    }
    assert f"works only for a Prometheus on {host} itself" in out
    assert f'metrics_listen = "ADDRESS:9464" in {tmp_path / "epycd.conf"}' in out
    assert "SocketBindAllow=tcp:9464" in out and "IPAddressAllow=" in out


def test_an_ipv6_listen_and_a_custom_job_and_interval(tmp_path: Path) -> None:
    code, out, err = scrape_config(
        tmp_path, "[::1]:9500", "--job", 'epyc "lab"', "--interval", "1m"
    )
    assert code == 0, err
    checked(tmp_path, out)
    found = fields(out)
    assert found["targets"] == '["[::1]:9500"]'
    assert found["job_name"] == '"epyc \\"lab\\""'
    assert (found["scrape_interval"], found["scrape_timeout"]) == ('"1m"', '"10s"')
    assert "SocketBindAllow=tcp:9500" in out


def test_every_address_is_scraped_by_the_host_name(tmp_path: Path) -> None:
    code, out, err = scrape_config(tmp_path, "0.0.0.0:9464", "--interval", "6s")
    assert code == 0, err
    checked(tmp_path, out)
    found = fields(out)
    assert found["targets"] == f'["{socket.gethostname()}:9464"]'
    assert (found["scrape_interval"], found["scrape_timeout"]) == ('"6s"', '"4s"')
    assert "works only for a Prometheus on" not in out


@pytest.mark.parametrize("interval", ["5x", "500ms", ""])
def test_a_bad_interval_is_a_usage_error(tmp_path: Path, interval: str) -> None:
    code, _out, err = scrape_config(tmp_path, "127.0.0.1:9464", "--interval", interval)
    assert code == 2 and "--interval" in err


def test_no_metrics_listen_is_an_input_error(tmp_path: Path) -> None:
    code, out, err = scrape_config(tmp_path, "")
    assert code == 2 and out == ""
    assert str(tmp_path / "epycd.conf") in err and "metrics_listen" in err
    assert 'metrics_listen = "127.0.0.1:9464"' in err


def test_a_gateway_adds_the_job_of_its_haproxy_exporter(tmp_path: Path) -> None:
    env = {
        "EPYCD_CONFIG_DIR": str(tmp_path),
        "EPYCD_METRICS_LISTEN": "127.0.0.1:9464",
        "EPYCD_GATEWAY_LISTEN": "0.0.0.0:8080",
        "EPYCD_GATEWAY_METRICS_LISTEN": "[::1]:9465",
    }
    result = CliRunner().invoke(main, ["metrics", "scrape-config", "--job", "lab"], env=env)
    assert result.exit_code == 0, result.stderr
    checked(tmp_path, result.stdout)
    jobs = [fields("  - job_name: " + job) for job in result.stdout.split("  - job_name: ")[1:]]
    assert [job["job_name"] for job in jobs] == ['"lab"', '"lab-gateway"']
    assert jobs[1]["targets"] == '["[::1]:9465"]'
    # no gateway, no job; a gateway with no metrics, none either
    for gateway, metrics in (("", "127.0.0.1:9465"), ("127.0.0.1:8080", "")):
        env |= {"EPYCD_GATEWAY_LISTEN": gateway, "EPYCD_GATEWAY_METRICS_LISTEN": metrics}
        alone = CliRunner().invoke(main, ["metrics", "scrape-config"], env=env)
        assert alone.exit_code == 0 and alone.stdout.count("job_name") == 1, alone.stdout
