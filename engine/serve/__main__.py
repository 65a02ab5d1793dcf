import sys

from engine.serve.server import main

sys.exit(main())
