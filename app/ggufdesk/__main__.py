"""`python -m ggufdesk` is the `ggufdesk` command."""
import sys

from ggufdesk.cli import main

sys.exit(main())
