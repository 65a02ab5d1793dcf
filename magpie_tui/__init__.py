"""The Textual workbench (``magpie tui``). It talks to the engine only through its public
API and the run folders; no measurement logic lives here."""
