import sys

from midlens.cli import main

sys.exit(main())
