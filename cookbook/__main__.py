import sys

from cookbook.cli import main

sys.exit(main())
