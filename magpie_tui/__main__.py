import sys

from magpie_tui.cli import main

sys.exit(main())
