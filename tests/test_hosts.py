"""What every treegym server counts as loopback, and the warning it prints when bound beyond it."""

from __future__ import annotations

import pytest

from treegym.errors import ConfigError
from treegym.hosts import check_port, exposure_warning, is_loopback, warn_if_exposed


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "127.255.255.254", "localhost", "LocalHost", "::1", "[::1]"])
def test_loopback_hosts_bind_without_a_warning(host: str) -> None:
    assert is_loopback(host)
    assert exposure_warning(host) is None


@pytest.mark.parametrize("host", ["128.0.0.1", "192.168.1.5", "10.0.0.1", "example.com", "::2", "localhost.example"])
def test_any_other_host_is_named_in_the_warning(host: str) -> None:
    assert not is_loopback(host)
    warning = exposure_warning(host, "the model API")
    assert warning is not None and host in warning and "the model API" in warning and "127.0.0.1" in warning


@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_binding_every_interface_says_so(host: str) -> None:
    assert "every interface" in (exposure_warning(host) or "")


def test_the_warning_goes_to_stderr_only_when_exposed(capsys: pytest.CaptureFixture[str]) -> None:
    warn_if_exposed("127.0.0.1", "the env server")
    assert capsys.readouterr().err == ""
    warn_if_exposed("0.0.0.0", "the env server")
    captured = capsys.readouterr()
    assert captured.out == "" and "the env server" in captured.err


@pytest.mark.parametrize("port", [-1, 65536, 99999])
def test_a_port_out_of_range_names_the_flag(port: int) -> None:
    with pytest.raises(ConfigError, match=f"--web-port must be from 0 to 65535.*{port}"):
        check_port(port, "--web-port")
    assert check_port(0) == 0 and check_port(65535) == 65535
