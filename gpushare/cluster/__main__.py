"""``python -m gpushare.cluster`` runs the controller process."""

import sys

from gpushare.cluster.main import main

sys.exit(main())
