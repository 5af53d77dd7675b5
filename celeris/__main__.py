"""``python -m celeris`` -> :func:`celeris.cli.main`."""

from celeris.cli import main

raise SystemExit(main())
