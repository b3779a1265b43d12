import sys

from specscope.backend.cli import main

sys.exit(main())
