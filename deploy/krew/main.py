"""kubectl gpushare, as krew installs it: this file is the ``__main__`` of the plugin's
executable, a Python zip application (hack/krew.py) that holds the CLI itself (the modules of
the CLI-only distribution kubectl-gpushare, hack/cli_wheel.py): nothing to pip install, only a
``python3`` >= 3.11 on PATH (or ``GPUSHARE_PYTHON``), docs/cli.md "Install"."""

import os
import sys

MINIMUM = (3, 11)
_AGAIN = "GPUSHARE_KREW_REEXEC"

wanted = os.environ.get("GPUSHARE_PYTHON")
if wanted and not os.environ.get(_AGAIN):
    os.environ[_AGAIN] = "1"
    try:
        os.execvp(wanted, [wanted, sys.argv[0], *sys.argv[1:]])
    except OSError as exc:
        sys.stderr.write(f"error: GPUSHARE_PYTHON={wanted} cannot run: {exc}\n")
        sys.exit(1)
if sys.version_info < MINIMUM:
    found = ".".join(str(n) for n in sys.version_info[:2])
    sys.stderr.write(
        f"error: kubectl gpushare needs Python >= 3.11, and this is {found}; set "
        "GPUSHARE_PYTHON to a newer one\n"
    )
    sys.exit(1)
os.environ["GPUSHARE_PROG"] = "kubectl gpushare"
from kubectl_gpushare.cli.main import main  # noqa: E402

sys.exit(main())
