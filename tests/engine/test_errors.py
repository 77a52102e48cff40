"""One error base (issue 32): what chaosproxy raises on purpose is a ChaosproxyError, and input the user
gave that cannot be used is a ConfigError, which the command line answers with exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chaosproxy.adapters.errors import UpstreamTimeout, UpstreamUnreachable
from chaosproxy.adapters.mitm import ConfdirError
from chaosproxy.adapters.stdio import SpawnError
from chaosproxy.cassette.format import CassetteError
from chaosproxy.control.api import ControlConfigError
from chaosproxy.engine.scenario import ScenarioError
from chaosproxy.errors import ChaosproxyError, ConfigError
from chaosproxy.protocols.llm.view import FormatError
from chaosproxy.records.drill_folder import DrillFolderError


@pytest.mark.parametrize("error", [ScenarioError, CassetteError, DrillFolderError, ControlConfigError, ConfdirError])
def test_input_that_cannot_be_used_is_a_config_error(error: type[Exception]):
    assert issubclass(error, ConfigError) and issubclass(error, ValueError)  # (callers caught ValueError)


@pytest.mark.parametrize("error", [UpstreamUnreachable, UpstreamTimeout, SpawnError, FormatError])
def test_the_typed_failures_are_chaosproxy_errors(error: type[Exception]):
    assert issubclass(error, ChaosproxyError) and not issubclass(error, ConfigError)


@pytest.mark.slow
def test_a_control_setting_refused_at_start_is_exit_2_with_its_reason(tmp_path: Path):
    """The stdio relay refuses a control API on a non-loopback address without a token (ControlConfigError,
    caught as the ConfigError it is, not by looking the control module up in sys.modules)."""
    done = subprocess.run([sys.executable, "-m", "chaosproxy", "stdio", "--control", "0.0.0.0:0", "--",
                           sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert "chaosproxy: " in done.stderr and "token" in done.stderr
