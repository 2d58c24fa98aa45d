"""``python -m e2e.testbed``: the test bed's command line (run from the repository root)."""

from e2e.testbed.cli import main

raise SystemExit(main())
