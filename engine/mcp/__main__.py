"""``python -m engine.mcp``: the same as ``magpie mcp``."""

import sys

from engine.mcp.cli import main

if __name__ == "__main__":
    sys.exit(main())
