"""``python -m hermes_async.model.attention.native [-v]``: build the native kernels (set-up).

Exit status 0 when built (or already built), 1 with the reason otherwise."""

from __future__ import annotations

import sys
import time

from hermes_async.model.attention.base import BackendUnavailable
from hermes_async.model.attention.native import build


def main(argv: list[str]) -> int:
    t0 = time.perf_counter()
    try:
        path = build(verbose="-v" in argv)
    except BackendUnavailable as e:
        print(f"native kernels not built: {e}", file=sys.stderr)
        return 1
    print(f"native kernels: {path} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
