"""``python -m cockpit``: the ``cockpit`` console script (``cockpit.cli:main``)."""

import sys

from cockpit.cli import main

if __name__ == "__main__":
    sys.exit(main())
