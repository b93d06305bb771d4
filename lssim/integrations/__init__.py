"""Plug-ins that let lssim's policies drive, and record, the RL framework a user trains with.

Each sub-package is optional and imports its framework lazily; see `lssim/integrations/README.md`.
"""
