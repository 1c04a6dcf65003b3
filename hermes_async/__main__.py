"""``python -m hermes_async``: the ``hermes-async`` command line (:mod:`hermes_async.cli`)."""

import sys

from hermes_async.cli import main

if __name__ == "__main__":
    sys.exit(main())
