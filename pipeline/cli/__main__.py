"""`python -m pipeline.cli`, the same as `mirai`."""

from pipeline.cli import main

raise SystemExit(main())
