import sys

from scalevec.cli import main

sys.exit(main())
