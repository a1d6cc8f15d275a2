"""``python -m gpushare.controller`` runs the controller process."""

import sys

from gpushare.controller.main import main

sys.exit(main())
