"""Benchmarks that print figures side by side (never timed tests): `fairlane bench WHAT`."""
