"""Widgets of the workbench: each one a domain noun, styled by theme variables only."""
