"""The device runtime: the loops that run engines, remote lanes, long-running components,
telemetry and metrics."""
