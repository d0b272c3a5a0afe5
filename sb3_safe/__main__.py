"""``python -m sb3_safe``: the ``sb3-safe`` command."""

import sys

from sb3_safe.cli import main

sys.exit(main())
