"""``python -m gpushare.exporter``: the exporter on its own (see gpushare.exporter.runner)."""

import sys

from gpushare.exporter.runner import main

sys.exit(main())
