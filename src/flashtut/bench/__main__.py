"""``python -m flashtut.bench``: see ``flashtut.bench`` for the commands."""
import sys

from .cli import main

sys.exit(main())
