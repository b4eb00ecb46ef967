import sys

from .page import main

sys.exit(main())
