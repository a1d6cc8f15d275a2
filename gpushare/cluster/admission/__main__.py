"""``python -m gpushare.cluster.admission CONFIG``: the admission process (started by the
controller, :mod:`gpushare.cluster.admission.host`)."""

import sys

from gpushare.cluster.admission.child import main

sys.exit(main(sys.argv[1:]))
