"""The tests run with the server's own thread settings (fairlane.host), as `fairlane serve`
does: set before any engine's native library is imported."""

from fairlane import host

host.configure()
