"""``python -m pulsar_nack.cli``: the same as the ``pulsar-nack`` script."""

import sys

from . import main

sys.exit(main())
