"""The Magpie workbench: a Textual front end over the run folders the engine writes.

Nothing here measures anything; the engine does, in its own processes.
"""
