"""``python -m longrun.testing.faults``: the fault report, or a child process of a group (see ``report.main``)."""

import sys

from longrun.testing.faults.report import main

sys.exit(main())
