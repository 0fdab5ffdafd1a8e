"""`epyc-llm-gateway.service` (epycd.gateway.unit) through the real tools: systemd-analyze
verifies it, and rates its sandbox no worse than the endpoints' own units allow."""

from __future__ import annotations

from pathlib import Path

import pytest

from epycd.gateway.unit import HAPROXY, UNIT, render_unit
from tests.render.realtools import verify, write_units
from tests.render.test_balancer import cached_haproxy
from tests.render.test_security import review

CONFIG = Path("/var/lib/epyc-llm/gateway/haproxy/haproxy.cfg")
KEYS = Path("/var/lib/epyc-llm/gateway/endpoint-keys.map")
CERT = Path("/etc/epyc-llm/gateway.pem")
METRICS = "127.0.0.1:9465"
MAX_GATEWAY_EXPOSURE = 2.5
"""systemd-analyze security's overall exposure the gateway may have at most (a set's
balancer rates 1.2, the host endpoints 1.4-1.8)."""


@pytest.mark.parametrize("listen", ["127.0.0.1:8080", "[::]:443", "0.0.0.0:8080"])
@pytest.mark.parametrize("tls", [None, CERT])
def test_the_unit_verifies(tmp_path: Path, listen: str, tls: Path | None) -> None:
    binary, _ = cached_haproxy()
    text = render_unit(
        listen=listen, metrics_listen=METRICS, config_file=CONFIG, tls_cert_file=tls,
        endpoint_keys_file=KEYS,
    )  # fmt: skip
    verify(write_units(tmp_path / "units", {UNIT: text.replace(HAPROXY, str(binary))}))
    assert ("LoadCredential=tls.pem:/etc/epyc-llm/gateway.pem" in text) == (tls is not None)


def test_a_low_port_keeps_one_capability_and_a_high_one_none() -> None:
    low = render_unit(listen="[::]:443", metrics_listen=METRICS, config_file=CONFIG,
                      tls_cert_file=None, endpoint_keys_file=None)  # fmt: skip
    high = render_unit(listen="127.0.0.1:8080", metrics_listen=METRICS, config_file=CONFIG,
                       tls_cert_file=None, endpoint_keys_file=None)  # fmt: skip
    # the metrics on a low port need the capability as much as the gateway does
    metrics_low = render_unit(listen="127.0.0.1:8080", metrics_listen="127.0.0.1:999",
                              config_file=CONFIG, tls_cert_file=None,
                              endpoint_keys_file=None)  # fmt: skip
    assert "AmbientCapabilities=CAP_NET_BIND_SERVICE\n" in metrics_low
    assert "CapabilityBoundingSet=CAP_NET_BIND_SERVICE\n" in low
    assert "AmbientCapabilities=CAP_NET_BIND_SERVICE\n" in low
    assert "PrivateUsers=yes" not in low
    assert "CapabilityBoundingSet=\n" in high and "PrivateUsers=yes\n" in high
    for text in (low, high):
        assert text.count("CapabilityBoundingSet=") == 1
        assert "User=epyc-llm\n" in text and "ExecReload=/bin/kill -USR2 $MAINPID\n" in text
        # the limits' handover at a reload: a folder of the gateway's user alone
        assert "RuntimeDirectory=epyc-llm-gateway\nRuntimeDirectoryMode=0700\n" in text


@pytest.mark.parametrize("listen", ["127.0.0.1:8080", "[::]:443"])
def test_the_sandbox_rates_2_5_or_better(tmp_path: Path, listen: str) -> None:
    unit = tmp_path / UNIT
    unit.write_text(render_unit(listen=listen, metrics_listen=METRICS, config_file=CONFIG,
                                tls_cert_file=CERT, endpoint_keys_file=KEYS))  # fmt: skip
    result = review(unit)
    assert result.returncode == 0 and result.exposure <= MAX_GATEWAY_EXPOSURE, result.output
