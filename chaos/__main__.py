"""``python -m chaos``: see ``chaos.run``."""

from chaos.run import main

raise SystemExit(main())
