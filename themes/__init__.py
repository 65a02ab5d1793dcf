"""Theme definitions (``*.yaml``) and style sheets (``*.tcss``) of the Magpie workbench.

Kept as data beside the code so that every colour lives here and nowhere else.
"""
