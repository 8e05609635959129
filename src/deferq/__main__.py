"""``python -m deferq``: the same as the ``deferq`` command."""

import sys

from deferq._cli import main

sys.exit(main())
