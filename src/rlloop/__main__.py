import sys

from rlloop.cli.main import main

sys.exit(main())
