"""`epycd`, the daemon (issue 6). Not built yet: it exits with a clear message."""

from __future__ import annotations

import sys


def main() -> None:
    sys.stderr.write("epycd: the daemon is not built yet (issue 6)\n")
    sys.exit(2)
