import sys

from rlloop.cli import main

sys.exit(main())
