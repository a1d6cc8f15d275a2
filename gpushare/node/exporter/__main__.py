"""``python -m gpushare.node.exporter``: the exporter on its own (see its ``runner``)."""

import sys

from gpushare.node.exporter.runner import main

sys.exit(main())
