import gc
import sys

from engine.serve.server import main

code = main()
# The server has stopped (requests ended, profile written, sockets closed) and the process exits:
# its teardown need not search the heap (torch's modules, the model) for cycles, about 0.5 s of
# CPU and a second of the stop's wait. Objects are still freed by their reference counts.
gc.freeze()
sys.exit(code)
