"""Temporal plumbing shared by the worker and the starter: settings, connection, codec, telemetry, schedules."""
