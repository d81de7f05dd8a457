"""``python -m attnlab ...`` (and ``torchrun -m attnlab ...``) = the ``attnlab`` command."""

import sys

from .cli import main

sys.exit(main())
