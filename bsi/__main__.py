import sys

from bsi.cli import main

sys.exit(main())
