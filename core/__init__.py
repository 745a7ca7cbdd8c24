"""Declarations shared by workflows and activities. Imports nothing that does I/O."""
